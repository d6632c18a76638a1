"""The systemd unit ``sglang-k26-ddtree``.

- ``unitfile``: rendered from systemd/sglang-k26-ddtree.service and the inventory (pure), installed on a host,
  the unit stored with a release installed again;
- ``systemctl``: the systemctl verbs on the unit (and on the health timer), and the restart's output read back.
"""
