"""packer.spec.errors: the hierarchy users catch (every error a PackerError, ConfigError also a ValueError)
and DecodeError's message and its rebuilding across processes."""

from __future__ import annotations

import pickle

import pytest

from packer.spec.errors import ConfigError, DecodeError, InputError, ManifestError, OutputError, PackerError
from packer.spec.registry import get_format

ERRORS = (ConfigError, InputError, OutputError, ManifestError, DecodeError)


@pytest.mark.parametrize("error", ERRORS)
def test_every_error_is_caught_as_a_packer_error(error):
    with pytest.raises(PackerError):
        raise error("x")


def test_only_config_errors_are_value_errors():
    assert [e.__name__ for e in ERRORS if issubclass(e, ValueError)] == ["ConfigError"]
    assert not issubclass(PackerError, ValueError)


def test_a_bad_argument_is_caught_as_python_catches_bad_arguments():
    # what a caller that knows nothing of packer writes: ``except ValueError``
    with pytest.raises(ValueError, match="unknown format 'zip'"):
        get_format("zip")


def test_a_decode_error_names_the_path_and_the_reason():
    error = DecodeError("cats/001.jpg", "cannot identify image file")
    assert str(error) == "cats/001.jpg: cannot identify image file"
    assert (error.path, error.reason) == ("cats/001.jpg", "cannot identify image file")


def test_a_decode_error_without_a_reason_is_its_path_alone():
    # torch's DataLoader rebuilds a worker's exception from its message alone
    error = DecodeError("cats/001.jpg")
    assert str(error) == "cats/001.jpg" and error.reason == ""
    rebuilt = DecodeError(str(error))
    assert (rebuilt.path, str(rebuilt)) == ("cats/001.jpg", "cats/001.jpg")


def test_a_decode_error_crosses_a_process_boundary_whole():
    copy = pickle.loads(pickle.dumps(DecodeError("dogs/ü 2.png", "truncated")))
    assert type(copy) is DecodeError
    assert (copy.path, copy.reason, str(copy)) == ("dogs/ü 2.png", "truncated", "dogs/ü 2.png: truncated")


def test_the_other_errors_keep_their_message():
    for error in (ConfigError, InputError, OutputError, ManifestError):
        assert str(error("out/manifest.json is damaged")) == "out/manifest.json is damaged"
