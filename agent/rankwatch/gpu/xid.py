"""Xid meanings live in ``rankwatch.xid`` (pure facts the detectors read too)."""

from __future__ import annotations

from rankwatch.xid import XIDS as XIDS
from rankwatch.xid import XidInfo as XidInfo
from rankwatch.xid import xid_info as xid_info
from rankwatch.xid import xid_label as xid_label
