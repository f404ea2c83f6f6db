"""Runs after the other sandbox modules: every container the tests created is gone (checked by label)."""

from tests.docker_support import close_all, docker_reason, leftover_containers


def test_no_container_left_behind():
    close_all()
    if docker_reason() is None:
        assert leftover_containers() == []
