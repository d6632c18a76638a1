# Sourced by the scripts that need root (the testbed: systemd-nspawn, mounts). `as_root "$0" "$@"` returns at
# once as root; otherwise it runs the calling script again through sudo, keeping OPSCTL, OPSCTL_*, CI and PYTHON,
# or, with no sudo on this machine, says how to run it and exits 2.
as_root() {
    [ "$(id -u)" = 0 ] && return 0
    if ! command -v sudo >/dev/null; then
        echo "error: $1 needs root (systemd-nspawn, mounts) and there is no sudo here: run it as root" >&2
        exit 2
    fi
    local keep=() name
    for name in $(compgen -e); do
        case $name in OPSCTL | OPSCTL_* | CI | PYTHON) keep+=("$name=${!name}") ;; esac
    done
    echo "$1: needs root; running it through sudo" >&2
    exec sudo -- env "${keep[@]}" bash "$@"
}
