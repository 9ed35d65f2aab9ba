# Sourced by scripts/test and scripts/test_jax: one JAX compilation
# cache shared by the processes of one test run. The suite starts many
# interpreters that compile the same programs (a launch's workers and its
# relaunch, the runs of one small recipe, an example and the test beside
# it); JAX's persistent cache lets the later ones load what an earlier one
# compiled. It holds every program, however quick to compile (Keras's
# eager ops on JAX are many small ones), starts empty with each run and is
# removed when the run ends, so no run depends on another's.
# ADVTRAIN_TEST_XLA_CACHE=0 turns it off (1, the default, keeps it).
case "${ADVTRAIN_TEST_XLA_CACHE:-1}" in
  0|1) ;;
  *) echo "advtrain: ADVTRAIN_TEST_XLA_CACHE must be 0 or 1. Received: ${ADVTRAIN_TEST_XLA_CACHE}" >&2; exit 2 ;;
esac
if [ "${ADVTRAIN_TEST_XLA_CACHE:-1}" = 1 ] && [ -z "${JAX_COMPILATION_CACHE_DIR:-}" ]; then
  JAX_COMPILATION_CACHE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/advtrain-test-xla.XXXXXX")
  trap 'rm -rf "$JAX_COMPILATION_CACHE_DIR"' EXIT
  export JAX_COMPILATION_CACHE_DIR
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
  export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
fi
