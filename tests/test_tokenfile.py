"""The token an agent makes when none is configured (issue 26 item 10): private to its user.

Another user of the node can pre-create ``<tmp>/rankwatch-<uid>`` in a 1777 /tmp, plant a
symlink or a FIFO, or loosen modes: each is refused with a line naming the path, nothing is
written through it and nothing blocks.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.server.tokenfile import UnsafeTokenFile, ensure_token, read_token, runtime_dir, token_path

OTHER_UID = 65534


def _env(folder: Path) -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": str(folder)}


@pytest.mark.unit
def test_made_once_private_and_shared(tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert read_token(env) is None
    token, path = ensure_token(env)
    assert path == tmp_path / "rankwatch" / "token" == token_path(env)
    st, folder = path.lstat(), path.parent.lstat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and stat.S_IMODE(folder.st_mode) == 0o700
    assert st.st_uid == folder.st_uid == os.geteuid()
    assert len(token) >= 32 and read_token(env) == token
    assert ensure_token(env)[0] == token  # the next agent of this user reuses it
    assert [p.name for p in path.parent.iterdir()] == ["token"]  # no temp file left


@pytest.mark.unit
def test_agents_starting_together_agree_on_one_token(tmp_path: Path) -> None:
    env = _env(tmp_path)
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(ensure_token(env)[0])) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 16 and len(set(got)) == 1 and read_token(env) == got[0]


@pytest.mark.unit
def test_without_xdg_runtime_dir_a_per_user_folder_under_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    assert runtime_dir({}).name == f"rankwatch-{os.geteuid()}"
    assert runtime_dir({"XDG_RUNTIME_DIR": "relative/path"}).name == f"rankwatch-{os.geteuid()}"


@pytest.mark.unit
def test_a_symlinked_folder_is_refused_and_nothing_written_through_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "xdg").mkdir()
    (tmp_path / "xdg" / "rankwatch").symlink_to(elsewhere)
    env = _env(tmp_path / "xdg")
    with pytest.raises(UnsafeTokenFile, match="rankwatch: not a folder"):
        ensure_token(env)
    with pytest.raises(UnsafeTokenFile):
        read_token(env)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.unit
def test_a_folder_open_to_others_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "rankwatch"
    folder.mkdir()
    folder.chmod(0o777)  # pre-created by someone who wants to read or plant the token
    with pytest.raises(UnsafeTokenFile, match=r"open to group or others \(mode 777\)"):
        ensure_token(_env(tmp_path))
    assert list(folder.iterdir()) == []


@pytest.mark.unit
def test_a_folder_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    folder = tmp_path / "rankwatch"
    folder.mkdir(mode=0o700)
    os.chown(folder, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeTokenFile, match=f"owned by uid {OTHER_UID}"):
        ensure_token(_env(tmp_path))


@pytest.mark.unit
@pytest.mark.parametrize("plant", ["symlink", "fifo", "loose", "foreign", "garbage"])
def test_a_planted_token_file_is_refused_not_read(tmp_path: Path, plant: str) -> None:
    folder = tmp_path / "rankwatch"
    folder.mkdir(mode=0o700)
    target = folder / "token"
    secret = tmp_path / "secret"
    secret.write_text("db_password=hunter2hunter2hunter2hunter2hunter2\n")
    secret.chmod(0o600)
    if plant == "symlink":
        target.symlink_to(secret)
    elif plant == "fifo":
        os.mkfifo(target, 0o600)
    elif plant == "loose":
        target.write_text("A" * 43 + "\n")
        target.chmod(0o644)
    elif plant == "foreign":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a file to another user")
        target.write_text("A" * 43 + "\n")
        target.chmod(0o600)
        os.chown(target, OTHER_UID, OTHER_UID)
    else:
        target.write_text("not a token\x1b]52;c;aGk=\x07\n")
        target.chmod(0o600)
    with pytest.raises(UnsafeTokenFile) as e:
        ensure_token(_env(tmp_path))
    assert str(target) in str(e.value) and "hunter2" not in str(e.value) and "\x1b" not in str(e.value)
    with pytest.raises(UnsafeTokenFile):
        read_token(_env(tmp_path))


@pytest.mark.unit
def test_url_prints_the_link_with_the_agents_token(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["url"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no token" in err and str(token_path()) in err
    token, _ = ensure_token()
    assert main(["url"]) == 0
    assert capsys.readouterr().out == f"http://127.0.0.1:9478/?token={token}\n"
    assert main(["url", "http://node7:9479/"]) == 0
    assert capsys.readouterr().out == f"http://node7:9479/?token={token}\n"
