"""A Triton model folder served unchanged: ``<model>/config.pbtxt`` + ``<model>/<N>/model.onnx``.

A model folder with a ``config.pbtxt`` and no ``config.json`` is read here: the text is parsed with the
``ModelConfig`` protobuf that tritonclient ships (``model_config.proto``) and translated into sloserve's
:class:`~sloserve.models.repository.ModelConfig`, checked against every served version's ONNX graph.

Versions. The numbered folders ``<model>/<N>/`` (``N`` a number not starting with 0; other folders are
not versions, as in Triton) hold ``<default_model_filename>`` (``model.onnx`` unless set; a folder of
that name holds ``model.onnx`` and its external data). ``version_policy`` picks the served ones:
``latest { num_versions }`` (the default, 1), ``all``, ``specific { versions }``. Each served version
is a variant of the model named by its number; ``ModelConfig.versions`` lists them (the highest last).

Honoured: ``name`` (the folder's), ``platform: "onnxruntime_onnx"`` or ``backend: "onnxruntime"``,
``max_batch_size``, ``input``/``output`` (``data_type``, ``dims``, ``reshape``; completed from the
graph of the highest served version when the config lists none, as Triton's auto-complete does),
``version_policy``, ``default_model_filename``, ``parameters`` (below), ``dynamic_batching`` (into
``ModelConfig.dynamic_batching``: its queue policy, and with the parameter ``batching_policy: "fixed"``
the delay and preferred sizes of sloserve's ``fixed`` policy, Triton's dynamic batcher). Kept in
:class:`~sloserve.models.repository.TritonSettings` (``LoadedModel.triton``) for the gateway:
``instance_group`` (its counts are the replicas per version; all ``KIND_CPU`` keeps the model on the
CPU), the tensors' ``reshape`` (clients see the ``dims``).

``max_batch_size``: above 0, the first dimension of every tensor is the batch and ``dims`` leave it
out (sloserve's own rule). 0 (or absent) with no ``input``/``output`` listed and a graph whose every
tensor has a variable first dimension: that dimension is the batch and ``max_batch_size`` is 4, as
Triton's auto-complete sets it. 0 with a first dimension fixed at 1 (in ``dims`` or in the graph):
served with batches of one row (``max_batch_size`` 1, shapes without that dimension). Any other 0 is
refused: sloserve batches along the first dimension, so it must be the batch (``max_batch_size`` > 0)
or 1.

``reshape``: the model takes ``reshape.shape``; sloserve's tensor shape is that one, and
``TritonSettings.reshape`` keeps the config's ``dims``, in which the gateway takes and answers the
tensor (as Triton does; the model's own shape is accepted too).

Accepted, not honoured (``TritonSettings.ignored`` names them): ``optimization``, ``model_warmup``,
``response_cache``, ``model_metrics``, ``metric_tags``, ``instance_group.rate_limiter`` /
``host_policy`` / ``profile`` / ``gpus``, ``output.label_filename``, ``input.format``, and ONNX Runtime backend
tuning ``parameters`` (thread counts, memory arenas, ...: the server's replica settings decide them).

Refused, naming the key: another platform or backend, ``runtime``, ``sequence_batching``,
``ensemble_scheduling``, ``batch_input``, ``batch_output``, ``cc_model_filenames``,
``model_operations``, ``model_repository_agents``, a decoupled ``model_transaction_policy``,
``instance_group`` of ``KIND_MODEL`` / ``secondary_devices`` / ``passive``, inputs that are
``optional``, shape tensors, ragged or non-linear, data types sloserve has no V2 name for (BF16),
``dynamic_batching`` without a batch dimension or with a preferred size above ``max_batch_size``.

``parameters`` (each a ``string_value``) carry sloserve's own settings:

=====================  ==========================================================================
``slo_ms``             the model's latency objective (a number; default 50)
``default_variant``    the version a request naming none is served by (default: the highest served)
``accuracy``           the accuracy (0..1) of every version (default: 0, unknown)
``accuracy_v<N>``      the accuracy of version N
``variant_fallback``   ``true``: a request naming no version may be served by another version when
                       the SLO needs it (sloserve's accuracy variants); default: ``true`` when an
                       accuracy parameter is given, else ``false`` (the default version only)
``batching_policy``    sloserve's batching policy for the model (default: the server's);
                       ``fixed`` takes ``preferred_batch_size`` and ``max_queue_delay_microseconds``
                       from ``dynamic_batching``
``batching``           a JSON object of config.json's ``batching`` (a policy and its knobs)
``description``        the model's description
=====================  ==========================================================================

Any other parameter is refused, naming it. Every problem names the file, the line (where the text has
it) and the key: ``<repo>/m/config.pbtxt:7: 'platform': ...``. The tensors' completion and checks
against the graph are in ``sloserve/models/triton_tensors.py``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sloserve.models.onnxcheck import check_variants, parse_onnx
from sloserve.models.schema import (
    DynamicBatching,
    InstanceGroup,
    LoadedModel,
    ModelConfig,
    ModelProblem,
    QueuePolicy,
    TritonSettings,
    check_name,
)
from sloserve.models.triton_tensors import GraphTensor, Where, batch_size, check_graph, graph_tensors, reshapes, tensors

VERSION_RE = re.compile(r"^[1-9][0-9]*$")
ONNX_PLATFORM, ONNX_BACKEND = "onnxruntime_onnx", "onnxruntime"
SLOSERVE_PARAMETERS = (
    "slo_ms",
    "default_variant",
    "accuracy",
    "accuracy_v<N>",
    "variant_fallback",
    "batching_policy",
    "batching",
    "description",
)
# The ONNX Runtime backend's tuning parameters: accepted, not honoured (the server's replica settings decide).
ORT_PARAMETERS = frozenset(
    {
        "intra_op_thread_count",
        "inter_op_thread_count",
        "execution_mode",
        "enable_mem_arena",
        "enable_mem_pattern",
        "memory.enable_memory_arena_shrinkage",
        "cudnn_conv_algo_search",
        "cudnn_conv_use_max_workspace",
        "gpu_mem_limit",
        "arena_extend_strategy",
        "do_copy_in_default_stream",
        "use_device_allocator_for_initializers",
        "enable_cpu_mem_arena",
        "share_session_between_instances",
        "optimization_level",
    }
)


def model_config_pb2() -> Any:
    """tritonclient's ``model_config_pb2``, without importing ``tritonclient.grpc`` (which brings grpc
    and its client) when nothing has yet: the generated module is read on its own."""
    known = sys.modules.get("tritonclient.grpc.model_config_pb2")
    if known is not None:
        return known
    mine = sys.modules.get("_sloserve_triton_model_config_pb2")
    if mine is not None:
        return mine
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        raise ModelProblem("reading a Triton config.pbtxt needs the tritonclient package (pip install tritonclient)")
    path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    gen = importlib.util.spec_from_file_location("_sloserve_triton_model_config_pb2", path)
    if gen is None or gen.loader is None:
        raise ModelProblem(f"tritonclient has no {path}")
    module = importlib.util.module_from_spec(gen)
    gen.loader.exec_module(module)
    sys.modules["_sloserve_triton_model_config_pb2"] = module
    return module


def load_triton_model(root: Path, name: str, override: dict | None = None) -> LoadedModel:
    """Read, translate and check the Triton model folder ``<root>/<name>`` (see the module docstring);
    ``override``'s keys replace those of the translated config. Raises :class:`ModelProblem`."""
    root = Path(root).resolve()
    folder = root / name
    path = folder / "config.pbtxt"
    if not path.resolve().is_relative_to(root):
        raise ModelProblem(f"{path} resolves outside the repository {root} (symlink?)")
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise ModelProblem(f"{path} is not text: {e}") from None
    pb = parse_config(path, text)
    where = Where(path, text)
    if pb.name and pb.name != name:
        raise where.problem("name", f"{pb.name!r} differs from its directory {name!r}", where.line("name"))
    refuse_unsupported(pb, where)
    versions, available = served_versions(pb, folder, where)
    settings = triton_settings(pb, where, versions)
    graphs = {}
    for v in versions:
        file = folder / v / settings.model_filename
        file = file / "model.onnx" if file.is_dir() else file
        if not file.resolve().is_relative_to(root):
            raise ModelProblem(f"{file} is outside the repository {root}")
        if not file.is_file():
            raise ModelProblem(f"{path}: version {v} (served by 'version_policy') has no model: {file} is missing")
        graphs[v] = parse_onnx(file, root)
    top = versions[-1]  # Triton's auto-complete reads one version: the highest served
    raw, settings = translate(pb, where, versions, available, graph_tensors(graphs[top]), settings, name)
    raw = {**raw, **(override or {})}
    src = f"{path} with the load's config override" if override else str(path)
    try:
        cfg = ModelConfig.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ModelProblem(f"{src}: '{key}': {first['msg']} ({e.error_count()} problem(s))") from None
    loaded = LoadedModel(config=cfg, root=folder, override=dict(override or {}), triton=settings)
    for v in versions[:-1]:  # the highest was the one completed from; the others must agree with it
        check_graph(pb, where, graph_tensors(graphs[v]), f"version {v} ({loaded.onnx_path(v)})", raw, top)
    check_variants(loaded, root, src)
    return loaded


def served_replicas(folder: Path) -> tuple[int, int | None]:
    """From ``folder/config.pbtxt`` and its version folders alone (no graph read): the versions served
    and the replicas per version its ``instance_group`` asks for (None: no group). Raises
    :class:`ModelProblem` as :func:`load_triton_model` would."""
    path = folder / "config.pbtxt"
    text = path.read_text()
    pb = parse_config(path, text)
    where = Where(path, text)
    versions, _ = served_versions(pb, folder, where)
    return len(versions), triton_settings(pb, where, versions).replicas()


def parse_config(path: Path, text: str):
    """``text`` as a ``ModelConfig`` message; a syntax error or an unknown field names its line."""
    from google.protobuf import text_format

    pb2 = model_config_pb2()
    msg = pb2.ModelConfig()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as e:
        what = re.sub(r"^\d+:\d+ : ", "", str(e))
        line, col = e.GetLine(), e.GetColumn()
        at = f"{path}:{line}:{col}" if line is not None and line > 0 else str(path)
        raise ModelProblem(f"{at}: not a valid Triton config.pbtxt: {what}") from None
    return msg


def refuse_unsupported(pb, where: Where) -> None:
    """A config.pbtxt that asks for what sloserve does not serve: the first such key, named."""
    if pb.platform and pb.platform != ONNX_PLATFORM:
        raise where.problem(
            "platform",
            f"{pb.platform!r} is not served: sloserve serves ONNX Runtime models only "
            f'(platform "{ONNX_PLATFORM}" or backend "{ONNX_BACKEND}")',
            where.line("platform"),
        )
    if pb.backend and pb.backend != ONNX_BACKEND:
        raise where.problem(
            "backend",
            f"{pb.backend!r} is not served: sloserve serves ONNX Runtime models only "
            f'(platform "{ONNX_PLATFORM}" or backend "{ONNX_BACKEND}")',
            where.line("backend"),
        )
    if not pb.platform and not pb.backend:
        raise where.problem(
            "platform",
            f'neither platform nor backend is set: set platform: "{ONNX_PLATFORM}" (sloserve serves ONNX only)',
        )
    refused = {
        "runtime": "a backend runtime other than ONNX Runtime's is not served",
        "sequence_batching": "stateful sequence batching is not served (sloserve batches stateless requests)",
        "ensemble_scheduling": "ensembles are not served; serve each model on its own",
        "batch_input": "batch inputs are not served",
        "batch_output": "batch outputs are not served",
        "cc_model_filenames": "a model file per compute capability is not served; use default_model_filename",
        "model_operations": "custom operation libraries are not loaded",
        "model_repository_agents": "repository agents are not run",
    }
    for key, why in refused.items():
        if _given(pb, key):
            raise where.problem(key, why, where.line(key))
    if pb.HasField("model_transaction_policy") and pb.model_transaction_policy.decoupled:
        raise where.problem(
            "model_transaction_policy.decoupled", "decoupled models are not served", where.line("decoupled")
        )
    for i, g in enumerate(pb.instance_group):
        at = where.line("instance_group")
        if g.kind == type(g).KIND_MODEL:
            raise where.problem(f"instance_group[{i}].kind", "KIND_MODEL is not served", where.line("kind", at or 1))
        for key in ("secondary_devices", "passive"):
            if _given(g, key):
                raise where.problem(f"instance_group[{i}].{key}", "is not served", where.line(key, at or 1))
    for kind, listed in (("input", pb.input), ("output", pb.output)):
        for i, t in enumerate(listed):
            for key in ("optional", "is_shape_tensor", "allow_ragged_batch", "is_non_linear_format_io"):
                if _given(t, key):
                    raise where.problem(
                        f"{kind}[{i}].{key}", f"is not served ({kind} {t.name!r})", where.tensor_line(kind, t.name, key)
                    )


def _given(msg, key: str) -> bool:
    """A field set in ``msg``: a repeated or map field not empty, a message present, a scalar not zero."""
    field = msg.DESCRIPTOR.fields_by_name.get(key)
    if field is None:  # (an output has no 'optional')
        return False
    if field.label == field.LABEL_REPEATED:
        return len(getattr(msg, key)) > 0
    if field.message_type is not None:
        return msg.HasField(key)
    return bool(getattr(msg, key))


def served_versions(pb, folder: Path, where: Where) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The versions ``version_policy`` serves (ascending), and every numbered folder."""
    available = tuple(sorted((p.name for p in folder.iterdir() if p.is_dir() and VERSION_RE.match(p.name)), key=int))
    policy = pb.version_policy.WhichOneof("policy_choice") if pb.HasField("version_policy") else None
    if policy == "specific":
        wanted = [str(v) for v in pb.version_policy.specific.versions]
        if not wanted:
            raise where.problem("version_policy.specific.versions", "lists no version", where.line("specific"))
        missing = [v for v in wanted if v not in available]
        if missing:
            raise where.problem(
                "version_policy.specific.versions",
                f"version(s) {missing} have no folder in {folder}; its versions: {list(available)}",
                where.line("versions", where.line("specific") or 1),
            )
        versions = sorted(set(wanted), key=int)
    elif not available:
        raise ModelProblem(
            f"{where.path}: the model has no version folder: put its model in {folder / '1' / 'model.onnx'} "
            "(numbered folders are its versions)"
        )
    elif policy == "all":
        versions = list(available)
    else:
        n = pb.version_policy.latest.num_versions if policy == "latest" else 1
        if n < 1:
            raise where.problem("version_policy.latest.num_versions", "must be at least 1", where.line("num_versions"))
        versions = list(available[-n:])
    return tuple(versions), available


def triton_settings(pb, where: Where, versions: tuple[str, ...]) -> TritonSettings:
    """The parts of config.pbtxt kept as they are: batching, instance groups, the file name."""
    filename = pb.default_model_filename or "model.onnx"
    try:
        check_name("default_model_filename", filename)
    except ValueError as e:
        raise where.problem("default_model_filename", str(e), where.line("default_model_filename")) from None
    ignored = [
        k for k in ("optimization", "model_warmup", "response_cache", "model_metrics", "metric_tags") if _given(pb, k)
    ]
    groups = []
    for g in pb.instance_group:
        ignored += [f"instance_group.{k}" for k in ("rate_limiter", "host_policy", "profile") if _given(g, k)]
        ignored += ["instance_group.gpus"] if g.gpus else []  # Ray places replicas on GPUs of their type
        kind = type(g).Kind.Name(g.kind)
        groups.append(InstanceGroup(name=g.name, kind=kind, count=max(g.count, 1), gpus=tuple(g.gpus)))
    ignored += [f"output.label_filename ({t.name})" for t in pb.output if t.label_filename]
    ignored += [f"input.format ({t.name})" for t in pb.input if t.format]
    ignored += [f"parameters.{k}" for k in sorted(pb.parameters) if k in ORT_PARAMETERS]
    accuracy_given = any(k == "accuracy" or k.startswith("accuracy_v") for k in pb.parameters)
    fallback = _param(pb, where, "variant_fallback", str(accuracy_given).lower()).lower()
    if fallback not in ("true", "false"):
        raise where.problem(
            "parameters.variant_fallback",
            f"{fallback!r} is not true or false",
            where.line("key", value="variant_fallback"),
        )
    return TritonSettings(
        model_filename=filename,
        version_policy=(pb.version_policy.WhichOneof("policy_choice") if pb.HasField("version_policy") else None)
        or "latest",
        variant_fallback=fallback == "true",
        instance_groups=tuple(groups),
        ignored=tuple(ignored),
    )


def dynamic_batching(pb, where: Where) -> DynamicBatching | None:
    """config.pbtxt's ``dynamic_batching`` block (None: the model has none)."""
    if pb.WhichOneof("scheduling_choice") != "dynamic_batching":
        return None
    db = pb.dynamic_batching
    batching = DynamicBatching(
        max_queue_delay_us=db.max_queue_delay_microseconds,
        preferred_batch_sizes=tuple(db.preferred_batch_size),
        preserve_ordering=db.preserve_ordering,
        priority_levels=db.priority_levels,
        default_priority_level=db.default_priority_level,
        default_queue_policy=_queue_policy(db.default_queue_policy),
        priority_queue_policy={int(k): _queue_policy(v) for k, v in db.priority_queue_policy.items()},
    )
    if batching.priority_levels and batching.default_priority_level > batching.priority_levels:
        raise where.problem(
            "dynamic_batching.default_priority_level",
            f"{batching.default_priority_level} is above priority_levels {batching.priority_levels}",
            where.line("default_priority_level"),
        )
    return batching


def _queue_policy(q) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=type(q).TimeoutAction.Name(q.timeout_action),
        default_timeout_us=q.default_timeout_microseconds,
        allow_timeout_override=q.allow_timeout_override,
        max_queue_size=q.max_queue_size,
    )


def _param(pb, where: Where, key: str, default: str) -> str:
    if key not in pb.parameters:
        return default
    return pb.parameters[key].string_value


def translate(
    pb,
    where: Where,
    versions: tuple[str, ...],
    available: tuple[str, ...],
    graph: tuple[dict[str, GraphTensor], dict[str, GraphTensor]],
    settings: TritonSettings,
    name: str,
) -> tuple[dict[str, Any], TritonSettings]:
    """sloserve's config (config.json's keys) of the Triton config ``pb``, its tensors completed from
    (or checked against) ``graph``, the highest served version's inputs and outputs; and the model's
    TritonSettings, final."""
    max_batch, batch_dim = batch_size(pb, where, graph)
    inputs = tensors(pb, where, "input", graph[0], batch_dim)
    outputs = tensors(pb, where, "output", graph[1], batch_dim)
    db = dynamic_batching(pb, where)
    if db is not None:
        if not batch_dim:
            raise where.problem(
                "dynamic_batching",
                "needs a batch dimension: max_batch_size is 0 (batches of one row here)",
                where.line("dynamic_batching"),
            )
        big = [b for b in db.preferred_batch_sizes if not 1 <= b <= max_batch]
        if big:
            raise where.problem(
                "dynamic_batching.preferred_batch_size",
                f"{big} outside 1..max_batch_size ({max_batch})",
                where.line("preferred_batch_size"),
            )
    raw: dict[str, Any] = {
        "name": name,
        "versions": list(versions),
        "platform": ONNX_PLATFORM,
        "inputs": inputs,
        "outputs": outputs,
        "max_batch_size": max_batch,
    }
    if db is not None:
        raw["dynamic_batching"] = db.model_dump()
    raw.update(sloserve_parameters(pb, where, versions, available))
    final = {**settings.model_dump(), "batch_dimension": batch_dim, "reshape": reshapes(pb, batch_dim)}
    return raw, TritonSettings.model_validate(final)


def sloserve_parameters(
    pb,
    where: Where,
    versions: tuple[str, ...],
    available: tuple[str, ...],
) -> dict[str, Any]:
    """sloserve's config keys from config.pbtxt's ``parameters`` (see the module docstring)."""
    out: dict[str, Any] = {}
    policy: dict[str, Any] = {}  # from batching_policy; the batching parameter's keys win
    batching: dict[str, Any] | None = None
    accuracy = dict.fromkeys(versions, 0.0)
    given_all: float | None = None
    per_version: dict[str, float] = {}
    for key in sorted(pb.parameters):
        value = pb.parameters[key].string_value
        line = where.line("key", value=key)
        pkey = f"parameters.{key}"
        if key in ORT_PARAMETERS or key == "variant_fallback":
            continue
        if key == "slo_ms":
            out["slo_ms"] = _number(where, pkey, value, line, low=0.0)
        elif key == "accuracy":
            given_all = _number(where, pkey, value, line, low=0.0, high=1.0)
        elif key.startswith("accuracy_v"):
            v = key.removeprefix("accuracy_v")
            if v not in available:
                raise where.problem(pkey, f"version {v!r} has no folder; its versions: {list(available)}", line)
            per_version[v] = _number(where, pkey, value, line, low=0.0, high=1.0)
        elif key == "default_variant":
            if value not in versions:
                raise where.problem(pkey, f"{value!r} is not a served version; served: {list(versions)}", line)
            out["default_variant"] = value
        elif key == "description":
            out["description"] = value
        elif key == "batching_policy":
            policy["policy"] = value  # "fixed" takes dynamic_batching's delay and sizes (ModelConfig)
        elif key == "batching":
            try:
                doc = json.loads(value)
            except ValueError as e:
                raise where.problem(pkey, f"is not JSON: {e}", line) from None
            if not isinstance(doc, dict):
                raise where.problem(pkey, "must hold a JSON object (config.json's batching)", line)
            batching = doc
        else:
            raise where.problem(
                pkey,
                f"is not a parameter sloserve knows; its parameters: {', '.join(SLOSERVE_PARAMETERS)} "
                "(and ONNX Runtime's tuning ones, not honoured)",
                line,
            )
    if policy or batching is not None:
        out["batching"] = {**policy, **(batching or {})}
    for v in versions:
        accuracy[v] = per_version.get(v, given_all if given_all is not None else 0.0)
    newest_first = sorted(versions, key=int, reverse=True)
    out["variants"] = [{"name": v, "accuracy": accuracy[v], "cost_flops": 0.0} for v in newest_first]
    out.setdefault("default_variant", newest_first[0])
    return out


def _number(where: Where, key: str, value: str, line: int | None, low: float, high: float | None = None) -> float:
    try:
        x = float(value)
    except ValueError:
        raise where.problem(key, f"{value!r} is not a number", line) from None
    if not math.isfinite(x) or x < low or (high is not None and x > high) or (high is None and x <= low):
        bound = f"in {low}..{high}" if high is not None else f"above {low}"
        raise where.problem(key, f"{value!r} must be {bound}", line)
    return x
