"""apt ops: signed repositories and pinned, held packages."""

from __future__ import annotations

from collections.abc import Mapping

from gpuk8s.facts.system import FileState, PackageState
from gpuk8s.ops import Op, change, noop, q, write_file

APT = ("DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 "
       "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold")


def source_line(url: str, suite: str, components: str, keyring: str) -> str:
    """One-line apt source; a flat repo (suite "/") has no components."""
    tail = f" {suite} {components}".rstrip() if suite != "/" else " /"
    return f"deb [signed-by={keyring}] {url}{tail}\n"


def repo(list_state: FileState, key_state: FileState, op_id: str, *, name: str, url: str,
         suite: str, components: str, key_url: str) -> Op:
    """Ensure the apt source ``name`` with its signing key, and refresh its package index.

    No-op when: the .list file names this URL and key URL and the keyring file exists.
    """
    keyring = key_state.path
    text = f"# managed by gpuk8s; key from {key_url}\n" + source_line(url, suite, components,
                                                                       keyring)
    data = text.encode()
    from gpuk8s.ops import sha256

    if list_state.exists and key_state.exists and list_state.sha256 == sha256(data):
        return noop(op_id, f"= apt source {name} -> {url}")
    fetch = (f"mkdir -p -m 0755 /etc/apt/keyrings && curl -fsSL --retry 3 {q(key_url)} "
             f"| gpg --dearmor --yes -o {q(keyring)} && chmod 0644 {q(keyring)}")
    update = (f"{APT} update -o Dir::Etc::sourcelist={q(list_state.path)} "
              "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0")
    return change(op_id, f"+ apt source {name} -> {url}", fetch,
                  write_file(list_state.path, data), update)


def packages(installed: Mapping[str, PackageState], op_id: str, wanted: Mapping[str, str], *,
             hold: bool = False, update_first: bool = False) -> Op:
    """Ensure packages are installed at versions matching their prefix ("" = any), held
    if ``hold``. A prefix like "1.36." picks the newest matching version at apply time.

    No-op when: each package is installed at a matching version (and held when asked).
    """
    missing: dict[str, str] = {}
    for name, prefix in wanted.items():
        state = installed.get(name)
        if state is None or not state.version.startswith(prefix):
            missing[name] = prefix
    unheld = [n for n in wanted if hold and n not in missing and not installed[n].held]
    if not missing and not unheld:
        desc = ", ".join(f"{n} {installed[n].version}" for n in wanted)
        return noop(op_id, f"= {desc}" + (" (held)" if hold else ""))
    commands: list[str] = []
    if missing:
        specs = []
        for name, prefix in missing.items():
            if not prefix:
                specs.append(name)
            elif prefix.endswith((".", "-")) or prefix.count(".") < 2:
                # resolve "newest version starting with prefix" on the host, at apply time
                specs.append(f"{name}=$(apt-cache madison {name} | awk -v p={q(prefix)} "
                             f"'index($3, p) == 1 {{print $3; exit}}')")
            else:
                specs.append(f"{name}={prefix}")
        check = " ".join(
            f"v=$(apt-cache madison {n} | awk -v p={q(p)} 'index($3, p) == 1' | head -n1); "
            f"[ -n \"$v\" ] || {{ echo 'no {n} version matching \"{p}\" in the configured "
            f"apt sources' >&2; exit 100; }};" for n, p in missing.items() if p)
        if update_first:
            commands.append(f"{APT} update")
        if check:
            commands.append(check)
        install = f"{APT} install --allow-change-held-packages " + " ".join(specs)
        # stale or missing package lists (a fresh box): refresh them once and try again
        commands.append(f"{install} || {{ echo 'gpuk8s: apt-get update, then retry'; "
                        f"{APT} update && {install}; }}")
    if hold:
        commands.append("apt-mark hold " + " ".join(wanted) + " >/dev/null")
    what = ", ".join(f"{n}{'=' + p + '*' if p else ''}" for n, p in missing.items())
    reason = f"+ install {what}" if missing else f"+ hold {', '.join(unheld)}"
    return change(op_id, reason, *commands, timeout=1800)
