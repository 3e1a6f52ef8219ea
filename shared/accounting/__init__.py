"""Accounting (ADR-0006): the day-partitioned request log, its retention, daily rollups,
and the cost and SLO reports built on them."""
