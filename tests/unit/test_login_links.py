"""One-time dashboard login links (shared.auth.login_links): a link opens one session,
in whichever replica, and is refused after, after its expiry, and when it was never
minted; the folder keeps no usable link."""

from __future__ import annotations

import threading
from pathlib import Path

from shared.auth.login_links import LINK_TTL, LoginLinks


def test_a_link_is_good_once(tmp_path: Path) -> None:
    links = LoginLinks(tmp_path / "links")
    token, expires = links.mint()
    assert expires > 0
    assert links.redeem(token)
    assert not links.redeem(token)
    # Another replica reading the same folder refuses it too.
    assert not LoginLinks(tmp_path / "links").redeem(token)


def test_the_folder_keeps_no_usable_link(tmp_path: Path) -> None:
    links = LoginLinks(tmp_path / "links")
    token, _ = links.mint()
    files = list((tmp_path / "links").iterdir())
    assert len(files) == 1
    assert token not in files[0].name
    assert token not in files[0].read_text()
    assert files[0].stat().st_mode & 0o077 == 0
    assert (tmp_path / "links").stat().st_mode & 0o077 == 0


def test_an_expired_or_unknown_link_is_refused_and_purged(tmp_path: Path) -> None:
    now = {"t": 1000.0}
    links = LoginLinks(tmp_path, clock=lambda: now["t"])
    token, expires = links.mint()
    assert expires == 1000.0 + LINK_TTL
    now["t"] = expires + 1
    assert not links.redeem(token)
    other, _ = links.mint()
    stale, _ = LoginLinks(tmp_path, clock=lambda: 0.0).mint(ttl=1.0)
    links.purge()
    assert len(list(tmp_path.iterdir())) == 1  # the live one only
    assert not links.redeem("A" * 43)
    assert not links.redeem("../../etc/passwd")
    assert not links.redeem(stale)
    assert links.redeem(other)


def test_two_uses_at_once_let_one_in(tmp_path: Path) -> None:
    links = LoginLinks(tmp_path)
    for _ in range(20):
        token, _ = links.mint()
        results: list[bool] = []
        threads = [threading.Thread(target=lambda t=token, r=results: r.append(
            links.redeem(t))) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(results) == [False, False, False, True]
