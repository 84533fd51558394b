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
import math
import os
import re
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sloserve.models.datatypes import NUMPY_TO_V2, V2_TO_NUMPY

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def check_name(kind: str, name: str) -> str:
    """Reject names that could escape the repository (``..``, ``/``, absolute paths)."""
    if not NAME_RE.match(name) or ".." in name:
        raise ValueError(f"invalid {kind} name {name!r}: use letters, digits, '_', '-', '.' (no '..', no '/')")
    return name


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Tensor name as the ONNX graph and the V2 protocol know it.")
    datatype: str = Field(description="V2 datatype: FP32, INT64, ...")
    shape: tuple[int, ...] = Field(description="Shape without the batch dimension; -1 = any.")

    @field_validator("datatype")
    @classmethod
    def _known_datatype(cls, v: str) -> str:
        if v not in V2_TO_NUMPY:
            raise ValueError(f"unknown V2 datatype {v!r}; known: {sorted(V2_TO_NUMPY)}")
        return v


class VariantConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Variant directory name, e.g. small / medium / large.")
    accuracy: float = Field(ge=0.0, le=1.0, description="Measured held-out accuracy (0..1).")
    cost_flops: float = Field(ge=0.0, description="Compute per row (multiply-adds x2).")
    params: int = Field(default=0, ge=0, description="Number of weights.")

    @field_validator("name")
    @classmethod
    def _safe(cls, v: str) -> str:
        return check_name("variant", v)


class QueuePolicy(BaseModel):
    """Triton's ``ModelQueuePolicy`` (a ``dynamic_batching`` queue's timeout and size)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_us: int = Field(default=0, ge=0, description="0: requests never time out in the queue.")
    allow_timeout_override: bool = False
    max_queue_size: int = Field(default=0, ge=0, description="0: unbounded.")


class DynamicBatching(BaseModel):
    """Triton's ``dynamic_batching`` of a config.pbtxt, as written (for the gateway to honour)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_queue_delay_us: int = Field(default=0, ge=0)
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False
    priority_levels: int = Field(default=0, ge=0)
    default_priority_level: int = Field(default=0, ge=0)
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: dict[int, QueuePolicy] = Field(default_factory=dict)


class InstanceGroup(BaseModel):
    """One of Triton's ``instance_group`` entries: ``count`` instances of a kind (on ``gpus``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    kind: Literal["KIND_AUTO", "KIND_CPU", "KIND_GPU"] = "KIND_AUTO"
    count: int = Field(default=1, ge=1)
    gpus: tuple[int, ...] = ()


class TritonSettings(BaseModel):
    """What a Triton model's config.pbtxt says that sloserve's own config has no field for
    (``sloserve/models/triton.py`` fills it: ``LoadedModel.triton``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_filename: str = Field(default="model.onnx", description="default_model_filename of every version.")
    version_policy: Literal["latest", "all", "specific"] = "latest"
    variant_fallback: bool = Field(
        default=False,
        description="A request naming no version may be served by another version than the default one "
        "(sloserve's accuracy variants); False: only by the default one, as Triton serves the latest.",
    )
    dynamic_batching: DynamicBatching | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()
    reshape: dict[str, tuple[int, ...]] = Field(
        default_factory=dict,
        description="Tensor name -> its config 'dims' (batch dimension excluded), for the tensors whose "
        "'reshape' differs: the model (and sloserve's 'shape') takes the reshape.",
    )
    batch_dimension: bool = Field(
        default=True, description="False: config.pbtxt's max_batch_size is 0 (the first dimension is fixed at 1)."
    )
    ignored: tuple[str, ...] = Field(default=(), description="Keys of config.pbtxt accepted but not honoured.")

    @field_validator("model_filename")
    @classmethod
    def _safe(cls, v: str) -> str:
        return check_name("default_model_filename", v)


class ModelConfig(BaseModel):
    """One model: its tensors, batching limits, SLO and accuracy variants."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    versions: tuple[str, ...] = Field(default=("1",), description="Versions served (metadata).")
    platform: str = "onnxruntime_onnx"
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = Field(default=64, ge=1, le=4096)
    slo_ms: float = Field(
        default=50.0,
        gt=0,
        description="The model's latency objective: what the autoscaler sizes for and what requests that name "
        "no slo_ms are counted against (they are served best-effort).",
    )
    variants: tuple[VariantConfig, ...] = Field(min_length=1)
    default_variant: str | None = Field(
        default=None, description="Variant used when a request asks for none (default: most accurate)."
    )
    batching: dict = Field(
        default_factory=dict,
        description="Batching policy name and its keyword arguments (default: the server's default_policy).",
    )
    description: str = ""

    @field_validator("name")
    @classmethod
    def _safe(cls, v: str) -> str:
        return check_name("model", v)

    def max_request_elements(self, max_rows: int | None = None) -> int | None:
        """Elements in the largest request the model accepts (``max_batch_size`` rows of every input,
        or ``max_rows`` if fewer), or None when an input has a variable dimension or holds BYTES."""
        rows = min(self.max_batch_size, max_rows or self.max_batch_size)
        n = 0
        for t in self.inputs:
            if t.datatype == "BYTES" or any(d < 0 for d in t.shape):
                return None
            n += rows * math.prod(t.shape)
        return n

    @model_validator(mode="after")
    def _cross(self) -> ModelConfig:
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate variant names in {names}")
        if self.default_variant is not None and self.default_variant not in names:
            raise ValueError(f"default_variant {self.default_variant!r} is not one of {names}")
        return self

    @property
    def variants_by_accuracy(self) -> tuple[VariantConfig, ...]:
        return tuple(sorted(self.variants, key=lambda v: (-v.accuracy, v.cost_flops)))

    @property
    def best_variant(self) -> str:
        return self.default_variant or self.variants_by_accuracy[0].name

    def variant(self, name: str) -> VariantConfig:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)


class LoadedModel(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    config: ModelConfig
    root: Path
    override: dict = Field(
        default_factory=dict,
        description="The config.json keys a load through the repository API replaced (a Ray replica, which "
        "reads the folder again, applies them too).",
    )
    triton: TritonSettings | None = Field(
        default=None, description="Set for a model read from a Triton config.pbtxt (its versions are its variants)."
    )

    def onnx_path(self, variant: str) -> Path:
        """The variant's ONNX file: ``<variant>/model.onnx``; for a Triton model
        ``<version>/<default_model_filename>``, or the ``model.onnx`` inside it when that is a folder
        (Triton's ONNX Runtime backend reads such a folder so, external data beside it)."""
        check_name("variant", variant)
        if self.triton is None:
            return self.root / variant / "model.onnx"
        path = self.root / variant / self.triton.model_filename
        return path / "model.onnx" if path.is_dir() else path

    def profile_dir(self, variant: str) -> Path:
        return self.root / variant / "profiles"


class ModelProblem(ValueError):
    """What is wrong with one model folder (its config, its files, config against graph), naming the
    file and the field to fix."""


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


def check_variants(model: LoadedModel, root: Path, src: str) -> None:
    """Every variant's ONNX file of ``model``: inside the repository, there, parsable, and agreeing
    with the config (``src`` names it in a problem)."""
    for v in model.config.variants:
        path = model.onnx_path(v.name)
        if not path.resolve().is_relative_to(root):
            raise ModelProblem(f"{path} is outside the repository {root}")
        if not path.is_file():
            raise ModelProblem(f"{src}: variant {v.name!r} has no {path}")
        graph = parse_onnx(path, root)
        problem = signature_mismatch(model.config, graph)
        if problem:
            raise ModelProblem(f"{src}: variant {v.name!r} ({path}): {problem}")


def parse_onnx(path: Path, root: Path):
    """The ONNX graph of ``path`` (without external data), or :class:`ModelProblem` saying why it
    cannot be loaded: a file that does not parse, an empty graph, external data outside its folder."""
    try:
        model = check_onnx_external_data(path, root)
    except ValueError as e:
        if "external data" in str(e):
            raise ModelProblem(str(e)) from None
        raise ModelProblem(f"model file {path} cannot be loaded ({type(e).__name__}: {e})") from None
    except Exception as e:  # the protobuf parser's own errors
        raise ModelProblem(f"model file {path} cannot be loaded ({type(e).__name__}: {e})") from None
    if model.ir_version <= 0 or not model.graph.node:
        raise ModelProblem(
            f"model file {path} cannot be loaded (no ir_version or an empty graph: an empty or foreign file?)"
        )
    return model


def check_onnx_external_data(path: Path, root: Path):
    """Refuse an ONNX file whose tensors point at external data outside its own directory.

    ONNX Runtime reads ``external_data`` locations relative to the model file; an absolute or
    ``..`` location (or a symlink out) would make it read any file the server can. The graph is
    parsed without its external data (~75 ms for the 41 MB heavy/large demo model).
    """
    import onnx
    from onnx import external_data_helper as edh

    model = onnx.load(str(path), load_external_data=False)
    base = path.resolve().parent
    for tensor in edh._get_all_tensors(model):
        if not edh.uses_external_data(tensor):
            continue
        loc = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (base / loc).resolve()
        if not loc or Path(loc).is_absolute() or not target.is_relative_to(base) or not target.is_relative_to(root):
            raise ValueError(
                f"{path}: tensor {tensor.name!r} reads external data from {loc!r}, "
                f"outside the model's directory; refused"
            )
    return model


def signature_mismatch(cfg: ModelConfig, model) -> str | None:
    """What in ``cfg`` (config.json) disagrees with the ONNX ``model``'s graph, naming the field to
    fix; None when they agree. Checked: the inputs are exactly the graph's (by name), and every
    tensor's datatype, rank and fixed dimensions; the first dimension is the batch, which the graph
    must leave dynamic (or fix at 1 for a ``max_batch_size`` of 1)."""
    from onnx import helper

    init = {t.name for t in model.graph.initializer}
    graph_in = {t.name: t for t in model.graph.input if t.name not in init}
    graph_out = {t.name: t for t in model.graph.output}
    names = [t.name for t in cfg.inputs]
    if set(names) != set(graph_in):
        return f"inputs {names} in config.json, but the ONNX graph takes {sorted(graph_in)} (fix 'inputs')"
    for kind, specs, graph in (("inputs", cfg.inputs, graph_in), ("outputs", cfg.outputs, graph_out)):
        for i, spec in enumerate(specs):
            t = graph.get(spec.name)
            where = f"'{kind}[{i}]' ({spec.name!r})"
            if t is None:
                return f"{where} is not an output of the ONNX graph; it has {sorted(graph)} (fix '{kind}')"
            tt = t.type.tensor_type
            try:
                onnx_dt = NUMPY_TO_V2.get(np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)), "BYTES")
            except (KeyError, TypeError, ValueError):
                onnx_dt = "an unknown type"
            if onnx_dt != spec.datatype:
                return f"{where} is {spec.datatype} in config.json, {onnx_dt} in the ONNX graph (fix its 'datatype')"
            if not tt.HasField("shape"):
                continue
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            want = [-1, *spec.shape]
            if dims and dims[0] > 0 and (dims[0] != 1 or cfg.max_batch_size != 1):
                return (
                    f"{where}: the ONNX graph fixes the batch dimension at {dims[0]}, but batches run 1.."
                    f"{cfg.max_batch_size} rows (export the graph with a dynamic first dimension, or, for a "
                    f"fixed 1, set 'max_batch_size' to 1)"
                )
            if len(dims) != len(want):
                return (
                    f"{where} has shape {want} in config.json (batch first), rank {len(dims)} in the ONNX "
                    f"graph {dims} (fix its 'shape')"
                )
            bad = [k for k in range(1, len(dims)) if dims[k] > 0 and want[k] != -1 and dims[k] != want[k]]
            if bad:
                return f"{where} has shape {want} in config.json, {dims} in the ONNX graph (fix its 'shape')"
    return None


def write_config(root: Path, cfg: ModelConfig) -> Path:
    path = root / cfg.name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
    return path


DeviceKind = Literal["cpu", "cuda"]
