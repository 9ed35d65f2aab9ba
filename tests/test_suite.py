"""How the suite runs (scripts/test): the xdist groups take effect.

pytest-xdist's `--dist loadgroup` keeps a group on one worker by adding
`@group` to each test's node id; if that stops working (pytest 9 ignores
the rewrite), launches would pick ports side by side and shared runs would
run once per worker, silently. This test sees its own node id.
"""

import os

import pytest


@pytest.mark.launch
def test_a_launch_test_runs_in_the_launch_group(request):
    marks = [m.args[0] for m in request.node.iter_markers("xdist_group")]
    assert marks == ["launch"]  # tests/conftest.py groups it
    if os.environ.get("PYTEST_XDIST_WORKER"):  # under scripts/test
        assert request.node.nodeid.endswith("@launch"), request.node.nodeid
