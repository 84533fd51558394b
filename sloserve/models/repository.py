"""The on-disk model repository and its config schema.

Layout::

    <repo>/<model>/config.json               ModelConfig (below)
    <repo>/<model>/<variant>/model.onnx       one ONNX file per accuracy variant
    <repo>/<model>/<variant>/profiles/<device_type>.json   latency profiles (``sloserve profile``)

A model folder with a ``config.pbtxt`` and no ``config.json`` is a Triton model, served unchanged: its
numbered version folders are its variants (``sloserve/models/triton.py`` reads and translates it).

Shapes in the config exclude the batch dimension: a request's tensors are ``[n, *shape]`` with
``1 <= n <= max_batch_size``. Names are validated so a config can never point outside the repo.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from sloserve.models.onnxcheck import check_onnx_external_data, check_variants, parse_onnx, signature_mismatch
from sloserve.models.schema import (
    NAME_RE,
    DynamicBatching,
    InstanceGroup,
    LoadedModel,
    ModelConfig,
    ModelProblem,
    QueuePolicy,
    TensorSpec,
    TritonSettings,
    VariantConfig,
    check_name,
)

__all__ = [
    "DeviceKind",
    "DynamicBatching",
    "InstanceGroup",
    "LoadedModel",
    "ModelConfig",
    "ModelProblem",
    "ModelRepository",
    "NAME_RE",
    "QueuePolicy",
    "TensorSpec",
    "TritonSettings",
    "VariantConfig",
    "check_name",
    "check_onnx_external_data",
    "check_variants",
    "is_model_folder",
    "load_model_dir",
    "parse_onnx",
    "relative_to_repository",
    "signature_mismatch",
    "write_config",
]


def relative_to_repository(text: str, root: Path) -> str:
    """``text`` (a problem's message) as a client may read it: every path inside the repository
    ``root`` relative to it, and ``root`` itself named, not spelled out. The server's log and the CLI
    keep the absolute paths; a client learns nothing of the server's filesystem.

    >>> relative_to_repository("/srv/repo/digits/config.json is not valid JSON", Path("/srv/repo"))
    'digits/config.json is not valid JSON'
    >>> relative_to_repository("model 'x' has no /srv/repo/x/config.json in the repository /srv/repo", Path("/srv/repo"))
    "model 'x' has no x/config.json in the model repository"
    """
    r = str(root)
    text = re.sub(rf"(?:the )?(?:model )?repository {re.escape(r)}(?![\w./-])", "the model repository", text)
    text = text.replace(r + os.sep, "")
    return re.sub(rf"{re.escape(r)}(?![\w.-])", "the model repository", text)


def is_model_folder(folder: Path) -> bool:
    """A model folder of a repository: it holds a ``config.json`` (sloserve's) or a ``config.pbtxt``
    (Triton's)."""
    return (folder / "config.json").is_file() or (folder / "config.pbtxt").is_file()


class ModelRepository:
    """Reads every ``<repo>/<model>/config.json`` (or Triton ``config.pbtxt``); the repo root bounds
    every file it opens."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.models: dict[str, LoadedModel] = {}

    def _require_root(self) -> None:
        if not self.root.is_dir():
            raise FileNotFoundError(
                f"model repository {self.root} does not exist; build the demo one with "
                f"`sloserve models build --repo {self.root}`"
            )

    def model_names(self) -> list[str]:
        """The model folders in the repository now (those holding a ``config.json`` or a Triton
        ``config.pbtxt``), sorted."""
        self._require_root()
        return sorted({p.parent.name for name in ("config.json", "config.pbtxt") for p in self.root.glob(f"*/{name}")})

    def load(self) -> ModelRepository:
        self._require_root()
        for name in self.model_names():
            self.models[name] = load_model_dir(self.root, name)
        if not self.models:
            raise FileNotFoundError(f"model repository {self.root} holds no <model>/config.json (or config.pbtxt)")
        return self

    def check(self) -> dict[str, str | None]:
        """Every model folder's problem (None when it loads): what ``sloserve models check`` prints."""
        return {name: None if isinstance(r, LoadedModel) else r for name, r in self.check_models().items()}

    def check_models(self) -> dict[str, LoadedModel | str]:
        """Every model folder, loaded, or its problem."""
        out: dict[str, LoadedModel | str] = {}
        for name in self.model_names():
            try:
                out[name] = load_model_dir(self.root, name)
            except (ModelProblem, FileNotFoundError) as e:
                out[name] = str(e)
        return out


def load_model_dir(root: Path, name: str, override: dict | None = None) -> LoadedModel:
    """Read and check ``<root>/<name>``: its ``config.json`` (top-level keys of ``override`` replace
    the file's), every variant's ``model.onnx`` (inside the repository, parsable, external data
    beside it) and the config against each graph. The one check of a model folder: start-up,
    ``load`` of the repository API and ``sloserve models check`` all run it. A folder with a Triton
    ``config.pbtxt`` and no ``config.json`` is read by :func:`sloserve.models.triton.load_triton_model`
    (``override``'s keys then replace those of the config it translates to). Raises
    :class:`ModelProblem` (or ``FileNotFoundError`` for a folder that is not there)."""
    root = Path(root).resolve()
    check_name("model", name)
    cfg_path = root / name / "config.json"
    if not cfg_path.is_file():
        if (root / name / "config.pbtxt").is_file():
            from sloserve.models.triton import load_triton_model

            return load_triton_model(root, name, override)
        raise FileNotFoundError(
            f"model '{name}' has no {cfg_path} (nor a Triton config.pbtxt) in the repository {root}"
        )
    if not cfg_path.resolve().is_relative_to(root):
        raise ModelProblem(f"{cfg_path} resolves outside the repository {root} (symlink?)")
    try:
        raw = json.loads(cfg_path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelProblem(f"{cfg_path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ModelProblem(f"{cfg_path} must hold a JSON object, not {type(raw).__name__}")
    raw = {**raw, **(override or {})}
    src = f"{cfg_path} with the load's config override" if override else str(cfg_path)
    try:
        cfg = ModelConfig.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ModelProblem(f"{src}: '{where}': {first['msg']} ({e.error_count()} problem(s))") from None
    if cfg.name != name:
        raise ModelProblem(f"{src}: name {cfg.name!r} differs from its directory {name!r}")
    model = LoadedModel(config=cfg, root=cfg_path.parent, override=dict(override or {}))
    check_variants(model, root, src)
    return model


def write_config(root: Path, cfg: ModelConfig) -> Path:
    path = root / cfg.name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
    return path


DeviceKind = Literal["cpu", "cuda"]
