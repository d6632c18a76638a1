"""What a host holds and prints, as data: the low floor every package that talks to a host may stand on
(docs/architecture.md, "Floors"). Standard library and release ids only; nothing here runs a command.

- :mod:`.layout`: the release root's paths (``Layout``) and the release ids they accept;
- :mod:`.facts`: the one probe of systemd, the unit, GPUs and disk, and its readers (``key_values``: the one reader
  of ``key=value`` output; ``parse_systemctl_show``).
"""
