"""Facts about systemd units: whether each is active and enabled, all of a probe's units read
with one ``systemctl show`` (gpuk8s.facts.system re-exports these names)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuk8s.facts import Fact, Source
from gpuk8s.sinks import shell


@dataclass(frozen=True)
class Unit:
    active: str
    enabled: str


#: what ``systemctl is-active`` and ``is-enabled`` print for one unit, as a Services line
_ASK_ONE = ('"$(systemctl is-active "$u" 2>/dev/null | head -n1)" '
            '"$(systemctl is-enabled "$u" 2>/dev/null | head -n1)"')
#: unit name suffixes systemctl takes as given (any other name gets ".service")
_UNIT_SUFFIXES = ("service", "socket", "device", "mount", "automount", "swap", "target", "path",
                  "timer", "slice", "scope")


class SystemdUnits(Source):
    """One ``systemctl show`` for every unit a probe's Services facts name. It leaves in
    $_gk_units a line per unit, ``<unit> <is-active> <is-enabled>``, each value what that
    command prints for the unit:

    - is-active prints the unit's ActiveState (``inactive`` for a unit that does not exist);
    - is-enabled prints what systemd's unit file state says, which is UnitFileState
      (``static``, ``masked``...), except: nothing for a unit without a unit file (show: an
      empty UnitFileState), ``alias`` for a name that is another unit's alias (show: that
      unit's Id). Where show cannot tell, is-enabled itself is asked: a generated unit (a
      SysV script's, whose state systemd-sysv-install says), a unit show did not find
      that has a SysV script, and every unit when show answered nothing (no systemd running,
      where is-enabled still reads the unit files).

    A name with a glob character would make show list other units: it gets the two
    commands of its own. UnitFileState is what systemd read at its last reload (systemctl
    enable and disable reload it); is-enabled reads the files at once."""

    def command(self) -> str:
        plain = [u for u in self.args if not any(c in u for c in "*?[")]
        names = " ".join(shell(u) for u in plain)
        suffixes = "|".join(f"*.{s}" for s in _UNIT_SUFFIXES)
        lines = ["_gk_units=$(echo"]
        if plain:
            lines.append(f"""systemctl show --property=Id,LoadState,ActiveState,UnitFileState \\
  -- {names} 2>/dev/null | for u in {names}; do
  i=; l=; a=; e=
  while IFS= read -r x && [ -n "$x" ]; do
    case $x in Id=*) i=${{x#*=}};; LoadState=*) l=${{x#*=}};; ActiveState=*) a=${{x#*=}};;
      UnitFileState=*) e=${{x#*=}};; esac
  done
  case $u in {suffixes}) n=$u;; *) n=$u.service;; esac
  if [ -z "$l" ]; then printf '%s %s %s\\n' "$u" {_ASK_ONE}; continue
  elif [ "$l" != not-found ] && [ "$i" != "$n" ]; then e=alias
  elif [ "$e" = generated ] || {{ [ "$l" = not-found ] && [ -e "/etc/init.d/${{n%.service}}" ]; }}
  then e=$(systemctl is-enabled "$u" 2>/dev/null | head -n1); fi
  printf '%s %s %s\\n' "$u" "$a" "$e"
done""")
        for u in self.args:
            if u not in plain:
                lines.append(f"u={shell(u)}; printf '%s %s %s\\n' \"$u\" {_ASK_ONE}")
        return "\n".join(lines) + ")"

    def ready(self) -> str:
        return '[ -n "${_gk_units+x}" ]'


class Services(Fact[dict[str, Unit]]):
    """``systemctl is-active`` / ``is-enabled`` of units, as SystemdUnits reads them for
    every Services fact of a probe at once."""

    def sources(self) -> tuple[Source, ...]:
        return (SystemdUnits(*self.args),)

    def command(self) -> str:
        # this fact's lines of the shared read; a unit it lacks is asked on its own
        return self.sources()[0].ensure() + "\nfor u in " + " ".join(
            shell(u) for u in self.args) + '''; do case $_gk_units in
  *"
$u "*) l=${_gk_units#*"
$u "}; printf '%s %s\\n' "$u" "${l%%"
"*}";;
  *) printf '%s %s %s\\n' "$u" ''' + _ASK_ONE + ''';;
esac; done'''

    def parse(self, output: str, exit_code: int) -> dict[str, Unit]:
        units = {}
        for line in output.splitlines():
            parts = line.split()
            if parts:
                units[parts[0]] = Unit(parts[1] if len(parts) > 1 else "unknown",
                                       parts[2] if len(parts) > 2 else "unknown")
        return units
