"""Fixtures of the model tests."""

import pytest

from helpers import kernel_of_width


@pytest.fixture(scope="session")
def kernels(tmp_path_factory):
    """width -> grpo_cli/models/few_rows.py's library built for that vector width (helpers.KERNEL_WIDTHS), each built
    once per session; skips the test where this machine cannot run it."""
    folder, built = tmp_path_factory.getbasetemp() / "kernel-widths", {}

    def of(width: str):
        if width not in built:
            built[width] = kernel_of_width(width, folder)
        return built[width]

    return of
