# Sourced by the CI scripts that install kvpool into vLLM environments.
#
# kvpool_wheel REPO DIR: sets kvpool_wheel to the kvpool wheel to install:
# $KVPOOL_WHEEL if it names a wheel (.ci/run builds one for all its steps),
# else a wheel built from REPO into DIR (with $PYTHON, default python3).
kvpool_wheel() {
    local repo=$1 dir=$2 started=$SECONDS
    if [ -n "${KVPOOL_WHEEL:-}" ]; then
        if [ ! -f "$KVPOOL_WHEEL" ]; then
            echo "KVPOOL_WHEEL=$KVPOOL_WHEEL: no such file" >&2
            exit 2
        fi
        kvpool_wheel=$KVPOOL_WHEEL
        echo "== kvpool wheel: $(basename "$kvpool_wheel") (KVPOOL_WHEEL)"
        return
    fi
    echo "== kvpool wheel from $repo"
    "${PYTHON:-python3}" -m pip --disable-pip-version-check wheel -q --no-deps -w "$dir" "$repo"
    kvpool_wheel=$(echo "$dir"/kvpool-*.whl)
    echo "   $(basename "$kvpool_wheel") ($((SECONDS - started))s)"
}
