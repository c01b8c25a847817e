"""packer's exceptions. Each names the path involved and says what to do about it."""

from __future__ import annotations

from typing import Optional


class PackerError(Exception):
    """Base class of every error packer raises on purpose."""


class ConfigError(PackerError, ValueError):
    """An option or combination of options that cannot work."""


class InputError(PackerError):
    """The source folder (or a labels file) cannot be used as given."""


class OutputError(PackerError):
    """The output location cannot be written as asked (exists, not a packer output, ...)."""


class ManifestError(PackerError):
    """A packed output is missing, damaged, foreign or of a newer format version."""


def damaged_in_store(error: BaseException) -> bool:
    """Whether ``error`` is botocore's ``FlexibleChecksumError``: an object read from a store whose
    bytes are not those of the checksum the store recorded for it (a store that records any
    checksum it is sent, as moto and rclone's S3 server do, kept bytes damaged on the way). Told by
    its name: botocore is imported only where an S3 store is used."""
    return type(error).__name__ == "FlexibleChecksumError"


def client_error(error: BaseException) -> bool:
    """Whether ``error`` is one of the S3 client's own (botocore's: an endpoint that does not answer,
    a connection refused, ...), which are no OSError: told by its module, botocore being imported
    only where an S3 store is used."""
    return type(error).__module__.split(".")[0] in ("botocore", "aiobotocore")


def store_refusal(error: BaseException) -> Optional[str]:
    """The error code of the store's answer that ``error`` reports (s3fs's translation of botocore's
    ClientError, which it keeps as the cause: ``BadDigest``, ``NotImplemented``...); None where no
    answer came (a connection that failed)."""
    answer = getattr(error.__cause__, "response", None)
    return None if answer is None else str(answer.get("Error", {}).get("Code", ""))


DAMAGED_IN_STORE = "is not what its recorded checksum is of: the remote copy is damaged"
"""How a message goes on after an object's URL when ``damaged_in_store`` holds of its read."""


class DecodeError(PackerError):
    """One source file could not be turned into a sample; the converter skips and reports it."""

    def __init__(self, path: str, reason: str = "") -> None:
        # reason may be empty: torch's DataLoader rebuilds a worker's exception from its message alone
        super().__init__(f"{path}: {reason}" if reason else path)
        self.path = path
        self.reason = reason

    def __reduce__(self):
        # Crosses process boundaries (worker to parent in --strict mode): rebuild from both fields.
        return (type(self), (self.path, self.reason))
