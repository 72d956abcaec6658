"""`--python-model-user` (SLUICE_PYTHON_MODEL_USER): refused at start-up with a clear error when the server
cannot run models as that user, and handed to the classic path when it can."""

from __future__ import annotations

import os

import pytest

from gateway.cli import main
from gateway.settings import Settings


@pytest.mark.parametrize("user, message", [("root", "must be an unprivileged user"),
                                           ("no-such-user-3f9a", "no such user")])
def test_serve_refuses_a_model_user_it_cannot_use(user, message, tmp_path, capsys):
    assert main(["serve", "--model-repository", str(tmp_path / "absent"), "--python-model-user", user]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sluice: ") and message in err and "Traceback" not in err


def test_serve_refuses_a_model_user_when_not_root(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["serve", "--model-repository", str(tmp_path / "absent"), "--python-model-user", "nobody"]) == 2
    assert "the server must run as root" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="a model user needs a root server")
def test_the_user_reaches_the_classic_limits(monkeypatch):
    monkeypatch.setenv("SLUICE_PYTHON_MODEL_USER", "nobody")
    assert Settings().classic_limits().python_model_user == "nobody"
    monkeypatch.delenv("SLUICE_PYTHON_MODEL_USER")
    assert Settings().classic_limits().python_model_user is None
