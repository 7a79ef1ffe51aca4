"""Recurring schedules, the pure part: cron and interval specs, the planner (docs/schedules.md)."""
