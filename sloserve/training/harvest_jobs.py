"""The training job API the REST router serves under the harvest controller
(``sloserve/training/controller.py``): a ``TrainingManager`` whose submitted jobs wait for
placement, with the controller's annotations on every answer."""

from __future__ import annotations

from sloserve.training.job import TrainingSpec
from sloserve.training.manager import JobInfo, TrainingManager


class HarvestJobs:
    """The job API the REST router serves in harvest mode: a submitted job is queued and the
    controller places it; a job preempted by hand stays held (in its record) until resumed by hand."""

    def __init__(self, manager: TrainingManager, on_change=None, annotate=None, admit=None):
        self.m, self._on_change = manager, on_change or (lambda: None)
        self._annotate = annotate or (lambda info: info)
        self._admit = admit or (lambda spec: None)  # a deadline job: admitted, best-effort, or JobRejected

    def is_held(self, job_id: str) -> bool:
        return self.m.held(job_id)

    def submit(self, spec: TrainingSpec) -> JobInfo:
        self._admit(spec)
        info = self.m.submit(spec, start=False)
        self._on_change()
        return self._annotate(info)

    def list(self) -> list[JobInfo]:
        return [self._annotate(i) for i in self.m.list()]

    def get(self, job_id: str) -> JobInfo:
        return self._annotate(self.m.get(job_id))

    def preempt(self, job_id: str) -> JobInfo:
        self.m.hold(job_id, True)
        return self._annotate(self.m.preempt(job_id))

    def start(self, job_id: str, gpu_type: str | None = None) -> JobInfo:
        self.m.hold(job_id, False)
        return self._annotate(self.m.start(job_id, gpu_type=gpu_type))

    def cancel(self, job_id: str) -> JobInfo:
        return self._annotate(self.m.cancel(job_id))
