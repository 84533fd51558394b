"""``sloserve train submit | list | preempt | resume | cancel`` over a jobs directory.

A job is the user's own training function (``--entry package.module:function``) and its JSON
config (``--config``), run by Ray Train on ``--workers`` GPUs of ``--gpu-type``. Without a gateway,
each job runs as a detached local process (``sloserve.training.worker``) that starts a local Ray
with the job's GPUs (emulated on a CPU box); ``cancel`` and ``preempt`` send SIGTERM (the gang
checkpoints at its next iteration boundary) and SIGKILL after ``--grace-s``. With ``--url`` the
same verbs go to a running gateway's training API instead: its placement controller queues the job
on harvested GPUs, and ``list`` adds each job's queue place, attained service and current gang.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

DEFAULT_DIR = os.environ.get("SLOSERVE_TRAINING_DIR", ".sloserve/training")


def _manager(args):
    from sloserve.training.manager import TrainingManager

    # no allow-list of entries here: these jobs run as the user who starts them, with their own code
    return TrainingManager(args.jobs_dir, grace_s=args.grace_s, entries=None)


def _print(infos, as_json: bool) -> None:
    if as_json:
        print(json.dumps([i.to_dict() for i in infos], indent=1))
        return
    print(f"{'JOB':<20} {'STATE':<10} {'ITER':>8} {'CKPT':>8} {'TOTAL':>8} {'LOSS':>8} {'LOST':>6} {'GPUS':<12} TENANT")
    for i in infos:
        loss = f"{i.loss:.4f}" if i.loss is not None else "-"
        gpus = f"{i.workers or i.num_gpus}x{i.gpu_type}"
        if i.min_workers is not None:
            gpus += f" ({i.min_workers}-{i.num_gpus})"
        print(
            f"{i.job_id:<20} {i.state:<10} {i.iteration:>8} {i.checkpoint_iteration:>8} "
            f"{i.total_iterations or '-':>8} {loss:>8} {i.lost_iterations:>6} {gpus:<12} {i.tenant or '-'}"
        )
        if i.queue_position is not None or i.attained_gpu_s is not None:
            place = f"#{i.queue_position} ({i.queue_reason})" if i.queue_position is not None else "-"
            print(f"{'':<20} queue: {place}, attained {i.attained_gpu_s or 0:.1f} GPU-s, preempted {i.preemptions}x")
        if i.prediction:
            print(f"{'':<20} model: {_prediction(i.prediction)}")
        if i.checkpoint:
            print(f"{'':<20} last checkpoint: {i.checkpoint}")
        for bad in i.corrupt_checkpoints:
            print(f"{'':<20} corrupt checkpoint skipped: {bad}")
        if i.error:
            print(f"{'':<20} failed:")
            for line in i.error.splitlines()[-10:]:
                print(f"{'':<22}{line}")


def _prediction(p: dict) -> str:
    """One line of a job's prediction (docs/placement.md, "Reading a prediction")."""
    if p.get("predictable"):
        text = (
            f"predictable, {p.get('remaining_s') or 0:.0f} s left ({p.get('remaining_iterations') or 0:.0f} iterations)"
        )
    else:
        text = f"unpredictable ({p.get('reason')})"
    errs = [f"{k} {100 * p[k + '_error']:.1f}%" for k in ("iteration", "loss") if p.get(k + "_error") is not None]
    if errs:
        text += ", held-out error " + ", ".join(errs)
    if p.get("order"):
        text += f"; ordered as {p['order']}"
    if p.get("slo") is not None:
        text += "; deadline: SLO-bound" if p["slo"] else f"; deadline: best-effort ({p.get('admission')})"
    return text


class _Remote:
    """The same verbs over a gateway's training API (``--url``): the queue's view of each job."""

    def __init__(self, url: str, token: str | None):
        self.base = url.rstrip("/") + "/v2/training/jobs"
        self.headers = {"authorization": f"Bearer {token}"} if token else {}

    def _call(self, method: str, path: str = "", body: dict | None = None):
        import httpx

        from sloserve.training.manager import JobInfo

        r = httpx.request(method, self.base + path, json=body, headers=self.headers, timeout=60)
        if r.status_code >= 400:
            detail = (
                (r.json().get("error") or r.json().get("detail") or r.text)
                if r.headers.get("content-type", "").startswith("application/json")
                else r.text
            )
            raise ValueError(f"{r.status_code}: {detail}")
        doc = r.json()
        return [JobInfo(**j) for j in doc["jobs"]] if "jobs" in doc else JobInfo(**doc)

    def submit(self, spec):
        return self._call("POST", "", spec.model_dump(mode="json"))

    def list(self):
        return self._call("GET")

    def start(self, job_id, gpu_type=None):
        return self._call("POST", f"/{job_id}/resume", {"gpu_type": gpu_type} if gpu_type else None)

    def preempt(self, job_id):
        return self._call("POST", f"/{job_id}/preempt")

    def cancel(self, job_id):
        return self._call("DELETE", f"/{job_id}")


def _jobs(args):
    """The jobs directory (standalone), or a gateway's training API with ``--url``."""
    if getattr(args, "url", None):
        return _Remote(args.url, args.token or os.environ.get("SLOSERVE_TOKEN"))
    return _manager(args)


def _config(text: str | None) -> dict:
    """``--config``: inline JSON or @path to a JSON file."""
    if not text:
        return {}
    if text.startswith("@"):
        with open(text[1:]) as f:
            text = f.read()
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("--config must be a JSON object")
    return doc


def _submit(args) -> int:
    from pydantic import ValidationError

    from sloserve.training.job import TrainingSpec

    try:
        spec = TrainingSpec(
            job_id=args.job_id,
            entry=args.entry,
            config=_config(args.config),
            workers=args.workers,
            min_workers=args.min_workers,
            gpu_type=args.gpu_type,
            memory_mib=args.memory_mib,
            total_iterations=args.iterations,
            checkpoint_every=args.checkpoint_every,
            tenant=args.tenant,
            model_class=args.model_class,
            target_loss=args.target_loss,
            max_workers=args.max_workers,
            deadline_s=args.deadline_s,
            iteration_time_s=args.iteration_time_s,
        )
        info = _jobs(args).submit(spec)
    except ValidationError as e:
        why = "; ".join(f"{x['loc'][0] if x['loc'] else 'job'}: {x['msg']}" for x in e.errors())
        print(f"sloserve: bad job: {why}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        print(f"sloserve: {e}", file=sys.stderr)
        return 2
    _print([info], args.json)
    return 0


def _list(args) -> int:
    try:
        infos = _jobs(args).list()
    except ValueError as e:
        print(f"sloserve: {e}", file=sys.stderr)
        return 2
    _print(infos, args.json)
    return 0


def _act(verb):
    def run(args) -> int:
        m = _jobs(args)
        try:
            if getattr(args, "gpu_type", None):
                info = m.start(args.job_id, gpu_type=args.gpu_type)
            else:
                info = getattr(m, verb)(args.job_id)
        except (KeyError, ValueError) as e:
            print(f"sloserve: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
            return 2
        _print([info], args.json)
        return 0

    return run


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="preemptible training jobs on idle GPUs")
    tsub = t.add_subparsers(dest="tcmd", required=True)

    def common(p):
        p.add_argument(
            "--jobs-dir", default=DEFAULT_DIR, help=f"jobs directory (default {DEFAULT_DIR}, env SLOSERVE_TRAINING_DIR)"
        )
        p.add_argument("--grace-s", type=float, default=1.0, help="preemption grace period before SIGKILL")
        p.add_argument("--json", action="store_true", help="print JSON")
        p.add_argument(
            "--url",
            default=None,
            help="a gateway's HTTP address (http://127.0.0.1:8000): act through its training API and "
            "placement controller instead of the jobs directory",
        )
        p.add_argument(
            "--token", default=None, help="bearer token with the training scope for --url (env SLOSERVE_TOKEN)"
        )
        return p

    s = common(tsub.add_parser("submit", help="submit a job (runs as a detached local process on a local Ray)"))
    s.add_argument("job_id")
    s.add_argument(
        "--entry",
        default="sloserve.training.demo:train",
        help="the training function, package.module:function (default: the PyTorch CNN demo on digits)",
    )
    s.add_argument("--config", default=None, help="JSON config for the function: inline, or @file.json")
    s.add_argument("--workers", type=int, default=1, help="gang size: Ray Train workers, one GPU each")
    s.add_argument("--min-workers", type=int, default=None, help="elastic: the fewest workers the job runs on")
    s.add_argument("--gpu-type", default="T4")
    s.add_argument("--memory-mib", type=int, default=2048, help="device memory per GPU (placement)")
    s.add_argument("--iterations", type=int, default=None, help="the job's length, if known (placement hint)")
    s.add_argument("--checkpoint-every", type=int, default=50, help="iterations between checkpoints (placement hint)")
    s.add_argument("--model-class", default=None, help="model class for the predictive queue's prior (e.g. resnet50)")
    s.add_argument("--target-loss", type=float, default=None, help="loss at which the job is done (predictive queue)")
    s.add_argument("--max-workers", type=int, default=None, help="elastic: the most workers the queue may give it")
    s.add_argument(
        "--deadline-s", type=float, default=None, help="finish within this many seconds (needs --iterations)"
    )
    s.add_argument(
        "--iteration-time-s", type=float, default=None, help="profiled seconds per iteration (deadline jobs)"
    )
    s.add_argument(
        "--tenant",
        default=None,
        help="the team the job belongs to (with --url: the token's tenant, the default; another needs the admin scope)",
    )
    s.set_defaults(func=_submit)
    common(tsub.add_parser("list", help="list jobs and their progress")).set_defaults(func=_list)
    for verb, method, helptext in (
        ("cancel", "cancel", "checkpoint, stop and cancel a job"),
        ("preempt", "preempt", "checkpoint and stop a job, keeping it resumable"),
        ("resume", "start", "resume a preempted job from its latest checkpoint"),
    ):
        p = common(tsub.add_parser(verb, help=helptext))
        p.add_argument("job_id")
        if verb == "resume":
            p.add_argument("--gpu-type", default=None, help="resume on GPUs of this type (from the same checkpoint)")
        p.set_defaults(func=_act(method))
