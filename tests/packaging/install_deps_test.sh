#!/usr/bin/env bash
# Checks tools/install-deps.sh: what it installs, that it skips apt entirely when nothing is
# missing, and that installing Open MPI leaves the MPI alternatives where they were.
#
# apt-get, dpkg-query, update-alternatives and sudo are replaced by small programs that keep the
# package list and the alternatives in files: the real ones would modify this machine and need
# the network. The script under test is unchanged; it finds the replacements first on PATH.
set -euo pipefail

script=${1:?usage: install_deps_test.sh <path to tools/install-deps.sh>}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
export FAKE_STATE=$work/installed FAKE_LOG=$work/apt.log FAKE_ALTS=$work/alternatives

cat >"$work/bin/dpkg-query" <<'EOF'
#!/usr/bin/env bash
package=${!#}
if grep -qx -- "$package" "$FAKE_STATE"; then
  printf 'install ok installed'
  exit 0
fi
echo "dpkg-query: no packages found matching $package" >&2
exit 1
EOF
# Installing libopenmpi-dev / openmpi-bin moves the alternatives the way Debian's higher
# Open MPI priorities do.
cat >"$work/bin/apt-get" <<'EOF'
#!/usr/bin/env bash
echo "DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-} apt-get $*" >>"$FAKE_LOG"
if [[ $1 == install ]]; then
  for arg in "${@:2}"; do
    case $arg in
      -*) ;;
      libopenmpi-dev) echo "$arg" >>"$FAKE_STATE"
        sed -i 's|^mpi auto .*|mpi auto /usr/bin/mpicc.openmpi|' "$FAKE_ALTS" ;;
      openmpi-bin) echo "$arg" >>"$FAKE_STATE"
        sed -i 's|^mpirun auto .*|mpirun auto /usr/bin/mpirun.openmpi|' "$FAKE_ALTS" ;;
      *) echo "$arg" >>"$FAKE_STATE" ;;
    esac
  done
fi
EOF
cat >"$work/bin/update-alternatives" <<'EOF'
#!/usr/bin/env bash
case $1 in
  --get-selections) cat "$FAKE_ALTS" ;;
  --set) echo "update-alternatives $*" >>"$FAKE_LOG"
    sed -i "s|^$2 .*|$2 manual $3|" "$FAKE_ALTS" ;;
  *) exit 2 ;;
esac
EOF
cat >"$work/bin/sudo" <<'EOF'
#!/usr/bin/env bash
exec "$@"
EOF
chmod +x "$work/bin/"*
export PATH="$work/bin:$PATH"

base=(build-essential cmake pkg-config mpich libmpich-dev libfmt-dev doctest-dev python3
  nlohmann-json3-dev iproute2 libgloo-dev libcli11-dev)
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
reset() {  # reset <installed packages...>
  printf '%s\n' "$@" >"$FAKE_STATE"
  : >"$FAKE_LOG"
  printf '%s\n' "mpi auto /usr/bin/mpicc.mpich" "mpi-x86_64-linux-gnu auto /usr/include/mpich" \
    "mpirun auto /usr/bin/mpirun.mpich" "editor auto /usr/bin/vim" >"$FAKE_ALTS"
}
run() {  # run <args...>: output in $out, exit status in $status
  status=0
  out=$("$script" "$@" 2>&1) || status=$?
}

# Everything present: no apt call at all, not even an update.
reset "${base[@]}"
run
[[ $status == 0 ]] || fail "all installed: exit $status: $out"
[[ ! -s $FAKE_LOG ]] || fail "all installed, but apt ran: $(cat "$FAKE_LOG")"
[[ $out == *"nothing to do"* ]] || fail "all installed: unexpected output: $out"

# Two missing: one update, then exactly those two, non-interactive, without recommends.
reset build-essential cmake pkg-config mpich libmpich-dev python3 nlohmann-json3-dev iproute2 \
  libgloo-dev libcli11-dev
run
[[ $status == 0 ]] || fail "two missing: exit $status: $out"
expected="DEBIAN_FRONTEND=noninteractive apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libfmt-dev doctest-dev"
[[ $(cat "$FAKE_LOG") == "$expected" ]] ||
  fail "two missing: apt calls were:"$'\n'"$(cat "$FAKE_LOG")"$'\n'"expected:"$'\n'"$expected"
[[ $out == *"installing: libfmt-dev doctest-dev"* ]] || fail "two missing: not announced: $out"

# Idempotent: a second run finds everything and changes nothing.
: >"$FAKE_LOG"
run
[[ $status == 0 && ! -s $FAKE_LOG ]] || fail "second run was not a no-op: $(cat "$FAKE_LOG")"

# --torch adds the libtorch packages, and only the missing ones.
reset "${base[@]}" zlib1g-dev
run --torch
[[ $(tail -n 1 "$FAKE_LOG") == *"--no-install-recommends python3-venv dataset-fashion-mnist libstb-dev" ]] ||
  fail "--torch: apt calls were: $(cat "$FAKE_LOG")"
run
[[ $(grep -c install "$FAKE_LOG") == 1 ]] || fail "without --torch nothing more is needed"

# --browser adds Chromium, for the report's browser test.
reset "${base[@]}"
run --browser
[[ $status == 0 && $(tail -n 1 "$FAKE_LOG") == *"--no-install-recommends chromium" ]] ||
  fail "--browser: apt calls were: $(cat "$FAKE_LOG")"

# --openmpi installs Open MPI on its own and puts the moved alternatives back; others untouched.
reset "${base[@]}"
run --openmpi
[[ $status == 0 ]] || fail "--openmpi: exit $status: $out"
grep -q -- "--no-install-recommends openmpi-bin libopenmpi-dev$" "$FAKE_LOG" ||
  fail "--openmpi: apt calls were: $(cat "$FAKE_LOG")"
grep -qx "mpi manual /usr/bin/mpicc.mpich" "$FAKE_ALTS" ||
  fail "--openmpi: mpi alternative not kept: $(cat "$FAKE_ALTS")"
grep -qx "mpirun manual /usr/bin/mpirun.mpich" "$FAKE_ALTS" ||
  fail "--openmpi: mpirun alternative not kept: $(cat "$FAKE_ALTS")"
if grep -q "update-alternatives --set \(mpi-x86_64-linux-gnu\|editor\)" "$FAKE_LOG"; then
  fail "--openmpi: touched an alternative that had not moved: $(cat "$FAKE_LOG")"
fi
[[ $out == *"keeping alternative 'mpi' at /usr/bin/mpicc.mpich"* ]] ||
  fail "--openmpi: restoring the alternatives was not announced: $out"

# --dry-run reports and changes nothing.
reset cmake
run --dry-run --torch
[[ $status == 0 && ! -s $FAKE_LOG ]] || fail "--dry-run ran apt: $(cat "$FAKE_LOG")"
[[ $out == *"would install: build-essential pkg-config"*"python3-venv"* ]] ||
  fail "--dry-run: unexpected output: $out"

# A typo is an error, not a silent no-op.
reset "${base[@]}"
run --torhc
[[ $status == 2 && $out == *"unknown option '--torhc'"* ]] || fail "bad option: exit $status: $out"

if ((failures)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "install-deps.sh: all checks passed"
