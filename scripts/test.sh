#!/usr/bin/env bash
# The whole test suite, in three steps:
#  1. the unit tests (no engine needed; the first failure stops them), while the images every
#     Docker test starts from are built; once they are, the swarm tests (a one-node swarm, a second
#     engine) run beside the unit tests, while host b's and the Slurm cluster's images are built; once the
#     unit tests have ended, the tests marked `builds` (they start no lab: they build, save and read images)
#     run beside the swarm tests that are left. No lab of another test runs then: this engine's `docker
#     swarm leave` takes the names away from every running compose lab's network (moby/moby#45144: a run
#     there then waits for ever on a name), and Docker 29's `swarm init` does too (moby/moby#51491);
#  2. the tests that start real containers: the training tests and, in a lane beside them, those that
#     mostly wait (builds of images, a Slurm cluster; late workers) (TFLAB_TESTS_LANES=1: one lane after
#     the other);
#  3. the tests that measure the host (CPU use against a quota, link rates, timings), with nothing
#     beside them.
# In CI a missing engine fails the Docker tests, never skips them. The 15 slowest tests are
# printed at the end. Arguments go to every pytest (a file, -k, --durations=0).
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh || exit 1

work=$(mktemp -d -t tflab-test.XXXXXX)
builds="" lane_pid="" swarm_lane="" builds_lane=""
declare -A build_pid
end_all() {  # every build stopped and each running lane ended as at a Ctrl-C, tearing its labs down
    for build in $builds; do pkill -TERM -P "$build" 2>/dev/null; done
    # A lane takes its first SIGTERM as a Ctrl-C and lets the rest pass; a tflab running inside one of its
    # tests may take that first one as its own Ctrl-C: each running lane is told again until it has ended.
    for pid in $(jobs -pr); do
        case " $builds " in *" $pid "*) continue ;; esac  # a build's own tflab was told above
        while kill -TERM "$pid" 2>/dev/null; do sleep 3; done
    done
    wait
    for log in waits swarm builds; do
        if [ -s "$work/$log.log" ]; then
            echo "test: the last lines of the $log lane:"; tail -n 15 "$work/$log.log"
        fi
    done
}
stop() {  # Ctrl-C, SIGTERM (CI's cancel)
    trap '' INT TERM HUP
    end_all
    echo "test: interrupted (every lane has torn down its labs)"
    exit 130
}
trap stop INT TERM HUP
trap 'rm -rf "$work"' EXIT

# pytest runs in the background so that a signal reaches this script at once (conftest.py turns a
# SIGTERM into pytest's own Ctrl-C). Its 5 means "none of these tests were selected": not a failure.
# lane NAME MARKERS ARGS...: a pytest of its own, its timings kept for the list of the slowest.
lane() {
    local name=$1 markers=$2; shift 2
    .venv/bin/python -m pytest -m "$markers" -p no:cacheprovider --basetemp "$work/$name" \
        --junitxml "$work/$name.xml" "$@" &
    lane_pid=$!
}
finish() {  # wait for a lane (the last started unless named); its exit status, 0 for "none selected"
    local code=0
    wait "${1:-$lane_pid}" || code=$?
    [ "$code" -eq 5 ] && code=0
    return "$code"
}
build() {  # build NAME COMMANDS...: in the background, its output in $work/NAME.log
    local name=$1; shift
    ( set -e; "$@"; echo "($((SECONDS - began)) s since the start)" ) >"$work/$name.log" 2>&1 &
    builds="$builds $!"
    build_pid[$name]=$!
}
built() {  # wait for a build (never left half done), and say how it went
    local name=$1 pid=${build_pid[$1]}
    builds=$(echo " $builds " | sed "s/ $pid / /")
    if wait "$pid"; then
        echo "test: $2:"; tail -n "$3" "$work/$name.log"
        return 0
    fi
    echo "test: $2 failed (the Docker tests' fixture tries again):"; tail -n 20 "$work/$name.log"
    return 1
}

# The images every Docker test starts from (the local base, the node image on it) are built while the
# unit tests run: a build waits mostly on the network and the disk, the unit tests use about a quarter
# of two cores (88 CPU-s in 175 s here). A build that fails here is built again, and its failure shown,
# by the Docker tests' own fixture.
# The base is built with a secret in its pip settings (tests/suite_base.py), which test_docker_secrets looks
# for in it: the suite builds one base, not two.
export TFLAB_TESTS_BASE_RECORD="$work/base.json"
began=$SECONDS
images() {
    .venv/bin/python tests/suite_base.py "$TFLAB_TESTS_BASE_RECORD"
    lab=$(mktemp -d -t tflab-prebuild-lab.XXXXXX)
    trap 'rm -rf "$lab"' EXIT
    port=$((40000 + RANDOM % 20000))
    .venv/bin/python -m tflab gen --lab "$lab/lab" --nodes 1 --name "prebuild$RANDOM" \
        --ssh-port-base "$port" --tensorboard-port-base "$((port + 10))" >/dev/null
    COLUMNS=200 .venv/bin/python -m tflab build --lab "$lab/lab"
}
build images images
# Chromium (the TensorBoard test's browser, in the second step) is installed beside the unit tests too.
build chromium ./scripts/setup.sh chromium

lane unit "not docker" -x -q -rs "$@"
unit=$lane_pid
# Once they are, the swarm tests run beside the unit tests (no lab of theirs is up: see above), while host
# b's image (the two-host walk's second engine, its test the swarm lane's last: it waits for this build) and
# the Slurm cluster's (from the base: the stock lab's node image is the base itself) are built. The walk's
# registry is given the base's layers then too (its push found them stored, as a second walk of a user's
# does: the engine compresses the 1.85 GB layer on one core, 50 to 60 s of the walk on the swarm lane's path,
# done here with the unit tests' part of two cores free). A failed build leaves the swarm tests for after
# the unit tests, whose fixture builds again.
if built images "the base and the node image, built beside the unit tests" 3; then
    echo "test: the swarm tests, beside the unit tests (their output follows the unit tests')"
    lane swarm "docker and swarm and not alone" -v -rs "$@" >"$work/swarm.log" 2>&1
    swarm_lane=$lane_pid
fi
build hostb .venv/bin/python scripts/two_hosts.py image --warm tflab-base:cpu
build slurm .venv/bin/python scripts/slurm_cluster.py image --image tflab-base:cpu
finish "$unit"; code=$?; unit_s=$((SECONDS - began))
echo "test: the unit tests took $unit_s s"
if [ "$code" -ne 0 ]; then  # the first failure stops the suite: the swarm tests and the builds as at a Ctrl-C
    end_all
    exit "$code"
fi
if [ -n "$swarm_lane" ]; then
    # With the unit tests done, the swarm tests (mostly the two-host walk: its push and pull of the node image)
    # leave part of two cores unused; the image tests use it. They start no lab (a swarm's leave takes no names
    # from a build) and leave the swarm alone. Not beside the unit tests: their timing checks failed once with
    # these beside them (66b0223).
    TFLAB_TESTS_SHARED_ENGINE=1 lane builds "docker and builds and not swarm and not alone" -v -rs "$@" \
        >"$work/builds.log" 2>&1
    builds_lane=$lane_pid
    finish "$swarm_lane"; code=$?
    echo "test: the swarm tests, run beside the unit tests:"
    cat "$work/swarm.log"
    finish "$builds_lane"; built_images=$?
    [ "$code" -ne 0 ] || code=$built_images
    echo "test: the image tests, run beside the swarm tests once the unit tests had ended:"
    cat "$work/builds.log"
else
    echo "test: the swarm tests, with no other test's lab beside them"
    lane swarm "docker and swarm and not alone" -v -rs "$@"
    finish; code=$?
fi
built hostb "host b's image and the registry's cache" 3
built slurm "the Slurm cluster's image" 2
built chromium "Chromium" 1
waits="docker and waits and not swarm and not alone"
[ -z "$builds_lane" ] || waits="$waits and not builds"  # the image tests ran in the first step

if [ "${TFLAB_TESTS_LANES:-2}" = 2 ]; then
    # Two lanes share the engine: neither may take down what the other made (conftest.py). In earlier
    # runs a training program sometimes never took its first step here: the swarm tests, then in the
    # waiting lane, left the swarm while a training test's lab ran, and its nodes could no longer resolve
    # each other's names (found on 2026-11-28; step 1 now runs them apart from any lab).
    echo "test: the Docker tests: the waiting tests (their output follows the others') beside the rest"
    TFLAB_TESTS_SHARED_ENGINE=1 lane waits "$waits" -v -rs "$@" \
        >"$work/waits.log" 2>&1
    waiting=$lane_pid
    TFLAB_TESTS_SHARED_ENGINE=1 lane training "docker and not waits and not swarm and not alone" -v -rs "$@"
    finish; trained=$?
    finish "$waiting"; waited=$?
    echo "test: the waiting tests, run beside the tests above:"
    cat "$work/waits.log"
else
    echo "test: the Docker tests: the training tests, then the waiting tests"
    lane training "docker and not waits and not swarm and not alone" -v -rs "$@"
    finish; trained=$?
    lane waits "$waits" -v -rs "$@"
    finish; waited=$?
fi
[ "$code" -ne 0 ] || code=$trained
[ "$code" -ne 0 ] || code=$waited

echo "test: the tests that measure the host, with nothing beside them"
lane alone "docker and alone" -v -rs "$@"
finish; alone=$?
[ "$code" -ne 0 ] || code=$alone

.venv/bin/python scripts/slowest.py 15 "$work/unit.xml" "$work/swarm.xml" "$work/builds.xml" "$work/training.xml" "$work/waits.xml" \
    "$work/alone.xml"
exit "$code"
