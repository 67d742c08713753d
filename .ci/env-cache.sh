# Sourced by .ci/vllm-env.sh and .ci/vllm-engine-env.sh: the disk check and
# the cache of built environments they share. The sourcing script defines
# step() (a progress line), and sets python (the interpreter), need_mib (free
# disk a build needs), tests_name and env_name (what the disk-check line
# names: the tests that cannot run, the environment that needs the space).

# env_check_disk DIR: exits (0 with KVPOOL_SKIP_VLLM=1, else 1) if the disk
# of DIR (or of its nearest existing parent) has less than need_mib free.
env_check_disk() {
    local existing=$1 avail_mib line
    while [ ! -d "$existing" ]; do existing=$(dirname "$existing"); done
    avail_mib=$(df -Pm "$existing" | awk 'NR == 2 { print $4 }')
    if [ "$avail_mib" -lt "$need_mib" ]; then
        line="!!!!! KVPOOL ${tests_name} TESTS CANNOT RUN: ${avail_mib} MiB free on the disk of ${existing}, ${env_name} needs ${need_mib} MiB !!!!!"
        if [ "${KVPOOL_SKIP_VLLM:-}" = 1 ]; then
            echo "$line (KVPOOL_SKIP_VLLM=1: skipped, nothing built)"
            exit 0
        fi
        echo "$line (set KVPOOL_SKIP_VLLM=1 to allow skipping)"
        exit 1
    fi
}

# env_key LINE FILE: the cache key of an environment: LINE (what is installed
# besides FILE), the interpreter's version and FILE's pins (not its comments).
env_key() {
    { echo "$1"; "$python" -c 'import sys; print(sys.version)'
      sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$2"; } | sha256sum | cut -c1-12
}

# env_purelib VENV: its site-packages.
env_purelib() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'; }

# env_cached BASE BUILD VENV PTH: BASE (a directory of the cache) is built
# once by `BUILD DIR` (which makes a venv at DIR), in a partial directory
# beside it that is moved into place when complete; VENV is then a thin venv
# whose site-packages reaches BASE's through the file PTH (appended after its
# own: what VENV installs wins). The cached tree is only read, never
# installed into, so it may move; VENV has no pip of its own (`python -m pip`
# runs BASE's, installing into VENV).
env_cached() {
    local base=$1 build=$2 venv=$3 pth=$4
    if [ -d "$base" ]; then
        step "cached environment: $base"
    else
        mkdir -p "$(dirname "$base")"
        env_check_disk "$(dirname "$base")"
        _env_partial=$(mktemp -d "$base.partial.XXXXXX")
        trap 'rm -rf "$_env_partial"' EXIT
        "$build" "$_env_partial/venv"
        # mv -T refuses to land on a directory a concurrent build made.
        if mv -T "$_env_partial/venv" "$base" 2> /dev/null; then
            step "cached as $base"
        else
            step "a concurrent build cached $base first; using that one"
        fi
        rm -rf "$_env_partial"
        trap - EXIT
    fi
    step "thin venv: $venv, over the cached packages"
    "$python" -m venv --without-pip "$venv"
    env_purelib "$base" > "$(env_purelib "$venv")/$pth"
}
