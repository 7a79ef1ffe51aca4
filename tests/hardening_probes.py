"""The hardening suite (issue 30): ``pytest -m hardening``.

Issue 30's probe of the running server, as an attacker on the same network, found doors that
held and doors that broke. The broken ones are fixed and tested in tests/test_hardening.py
(the protocol port) and tests/test_hardening_web.py (the dashboard's and the metrics' own
sockets), which are in the suite whole. The doors that held were already tested where their
code is; ``PROBES`` names those tests, so that they are in the suite too without being written
twice, and tests/test_hardening.py checks that every name here is a test that exists.
"""

from __future__ import annotations

import pytest

# Every test of these files is in the suite.
WHOLE = ("test_hardening.py", "test_hardening_web.py", "test_signins.py")

# file -> the tests of it that probe a door that held (a parametrized test: all its cases).
PROBES: dict[str, tuple[str, ...]] = {
    # SSRF: every disguise of a loopback or private address in an HTTP target is refused
    # (numeric forms, IPv6-mapped, DNS names that resolve to one), redirects not followed.
    "test_allow.py": (
        "test_public_refuses_what_is_not_globally_routable",
        "test_loopback_is_refused_at_add_by_default",
        "test_numeric_ipv4_forms_are_refused",
        "test_a_url_without_a_host_is_refused",
        "test_a_name_is_refused_at_add_when_only_name_entries_exist_and_none_match",
    ),
    "test_delivery_http.py": (
        "test_a_redirect_is_a_failed_attempt_and_is_not_followed",
        "test_a_name_is_refused_after_dns_when_its_address_is_not_allowed",
    ),
    # Auth: every method before auth refused, the token compared in constant time.
    "test_server_inprocess.py": (
        "test_auth_gates_everything_but_ping_and_auth",
        "test_a_half_sent_message_is_cut_off_after_the_message_timeout",  # slowloris
        "test_connections_over_the_limit_are_refused_with_a_reason",
    ),
    "test_first_run.py": ("test_listening_beyond_loopback_without_a_token_is_refused",),
    # CSRF variants, the viewer role, hostile ids, topics and bodies, the headers.
    "test_web.py": (
        "test_csrf_refused_without_the_token_and_from_a_foreign_origin",
        "test_without_a_token_loopback_is_the_admin_with_csrf_still_checked",
        "test_a_viewer_gets_403_on_every_mutating_route_and_sees_no_buttons",
        "test_viewers_may_be_kept_from_bodies",
        "test_every_response_carries_the_csp_404s_and_static_files_too",
        "test_no_inline_script_or_style_on_any_page",
        "test_hostile_ids_topics_bodies_and_errors_never_appear_raw",
        "test_five_failures_in_a_row_give_429_even_with_the_right_token",
        "test_the_api_takes_a_bearer_token",
        "test_streams_are_capped_and_need_a_session",
        "test_at_most_eight_dashboard_requests_run_at_once",
    ),
    # Big bodies, huge size claims, deep nesting, garbage: refused early, nothing pinned.
    "test_protocol.py": (
        "test_oversized_complete_message_is_too_large",
        "test_oversized_message_is_refused_before_it_is_complete",
        "test_a_gigabyte_claim_is_refused_after_about_the_limit",
        "test_container_over_the_limit_is_too_large",
        "test_unfinished_claims_build_nothing",
    ),
    "test_server.py": (
        "test_bad_input_gets_a_notification_and_a_close",
        "test_truncated_message_then_close_harms_nobody",
        "test_a_client_that_never_reads_cannot_grow_the_server",
    ),
    "test_connections.py": ("test_a_connection_cut_mid_message_leaves_nothing_behind",),
    # No secret in any log line.
    "test_logging.py": ("test_a_run_logs_each_event_once_and_no_secret",),
}


def mark_hardening(items: list[pytest.Item]) -> None:
    """Give the ``hardening`` marker to the suite's tests."""
    for item in items:
        file = item.path.name
        name = getattr(item, "originalname", item.name)
        if file in WHOLE or name in PROBES.get(file, ()):
            item.add_marker(pytest.mark.hardening)
