"""Every error outlast raises, under one root.

::

    OutlastError
    ├── InvalidInput (ValueError)   malformed input from a user: an argument, a label, a URL
    │   └── InvalidJobId            an id that is not a single clean name
    ├── JobNotFound (LookupError)   no job with that id in the store
    │   └── ScheduleNotFound        no schedule with that name
    ├── ScheduleExists              a schedule of that name exists (add it with replace)
    ├── DuplicateJob                a live job holds the unique key (``on_conflict="raise"``)
    ├── JobActive                   delete of a job that is not terminal, without force
    ├── WorkerLockHeld              another live process already works on this job
    ├── InvalidTransition           a move the status machine does not allow
    ├── CorruptJob                  a stored document or row is not a valid job
    ├── StoreError                  the store's driver failed (sqlite3, psycopg, OSError)
    ├── Pause                       raised by a job to ask a person a question
    ├── Fail                        raised by a job to fail at once, without retry
    ├── Canceled                    raised inside a job by ``check_cancel()`` after a cancel
    ├── PollTimeout                 a pipeline's poll stage ran out of time (code ``timeout``)
    └── TimedOut                    an async job's attempt reached its timeout (code ``timeout``)

Driver exceptions never escape the store: adapters translate them into ``StoreError``
(``raise … from exc``). A class's docstring is its default message.
"""

from __future__ import annotations

from typing import Any


class OutlastError(Exception):
    """An outlast operation failed."""

    #: The error code recorded on a job that this error fails (see ``ErrorInfo.code``).
    code: str = "error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidInput(OutlastError, ValueError):
    """The input is malformed."""


class InvalidJobId(InvalidInput):
    """The job id is not a single clean name."""


class JobNotFound(OutlastError, LookupError):
    """No job with that id."""


class ScheduleNotFound(JobNotFound):
    """No schedule with that name."""


class ScheduleExists(OutlastError):
    """A schedule of that name exists already."""


class DuplicateJob(OutlastError):
    """A live job holds that unique key."""

    def __init__(self, message: str, existing: str | None = None) -> None:
        super().__init__(message)
        #: The id of the live job that holds the key.
        self.existing = existing


class JobActive(OutlastError):
    """The job is not finished; pass force=True to delete it anyway."""


class WorkerLockHeld(OutlastError):
    """Another live process already holds this job's worker lock."""


class InvalidTransition(OutlastError):
    """The status machine does not allow this move."""


class CorruptJob(OutlastError):
    """A stored job document is not valid."""


class StoreError(OutlastError):
    """The store failed."""


class Pause(OutlastError):
    """Raised by a job to pause until a person answers ``question``."""

    def __init__(self, question: Any = None) -> None:
        super().__init__("the job asked a question")
        self.question = question


class Fail(OutlastError):
    """Raised by a job to fail at once, without using its remaining attempts."""


class Canceled(OutlastError):
    """The job was canceled."""


class PollTimeout(OutlastError):
    """A poll stage's condition did not hold before its timeout."""

    code = "timeout"


class TimedOut(OutlastError):
    """The attempt ran past its timeout."""

    code = "timeout"
