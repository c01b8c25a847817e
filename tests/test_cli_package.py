"""The pieces of packer/cli/ that the commands share: the stop-signal block and the preprocessing options."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from packer.cli.options import decode_options, preprocess_config, preprocess_options
from packer.cli.signals import stop_on_signals
from packer.system import clear_stop_request, request_stop


def test_stop_on_signals_routes_both_signals_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            with stop_on_signals():
                assert signal.getsignal(signal.SIGTERM) is request_stop
                assert signal.getsignal(signal.SIGINT) is request_stop
                os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's SIGTERM stops the block as Ctrl-C does
                signal.pause()  # not reached when the handler runs first; a safety net if it has not yet
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    finally:
        # The request stays noted after the block (the CLI exits then); a later stop_signals_held in
        # this test process would raise it again.
        clear_stop_request()


def test_preprocess_options_give_the_config_of_what_was_given():
    @click.command()
    @preprocess_options
    @decode_options
    def command(**kwargs) -> None:
        pre = preprocess_config(**kwargs)
        click.echo(
            f"{pre.size} {pre.resize} {pre.geometry} {pre.mode} {pre.fill} {pre.background} {pre.dtype} "
            f"{pre.reduced_decode}"
        )

    assert [p.name for p in command.params] == [
        "size",
        "resize",
        "crop",
        "geometry",
        "mode",
        "interpolation",
        "fill",
        "background",
        "normalize",
        "dtype",
        "full_decode",
        "max_pixels",
    ]
    defaults = CliRunner().invoke(command, [])
    assert defaults.output == "(224, 224) shorter-crop torchvision RGB (0, 0, 0) (255, 255, 255) uint8 True\n"
    given = CliRunner().invoke(
        command, ["--size", "32x24", "--resize", "pad", "--fill", "9", "--full-decode", "--geometry", "fractional"]
    )
    assert given.output == "(32, 24) pad fractional RGB (9, 9, 9) (255, 255, 255) uint8 False\n"


def test_fill_outside_0_255_is_a_bad_parameter():
    with pytest.raises(click.BadParameter, match="values must be 0-255"):
        preprocess_config("224", "pad", "RGB", "bilinear", "0,0,256", "255", "none", "uint8", 10**8, False)


def test_importing_the_cli_imports_neither_torch_nor_readers():
    code = "import sys, packer.cli; print('torch' in sys.modules, 'readers' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]
