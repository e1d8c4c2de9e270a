"""The real etcd cluster of the tests (``serving.local.etcd``), and the test's check that it is
installed (a failure naming the install script, never a skip: CI installs it)."""

from __future__ import annotations

import pytest

from serving.local.etcd import MISSING, EtcdCluster, EtcdMember, etcd_available, free_port, free_ports

__all__ = ["EtcdCluster", "EtcdMember", "etcd_available", "free_port", "free_ports", "require_etcd"]


def require_etcd() -> None:
    if not etcd_available():
        pytest.fail(MISSING)
