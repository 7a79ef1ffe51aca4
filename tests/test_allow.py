"""``--http-allow``: parsing every entry kind, ``public``, and the check at ``add``."""

from __future__ import annotations

import pytest

from delaywheel.delivery.allow import AllowList

NOT_PUBLIC = [
    "127.0.0.1",
    "127.8.9.10",
    "10.1.2.3",
    "172.16.0.1",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "100.64.0.1",  # CGNAT
    "0.0.0.0",
    "224.0.0.1",  # multicast, which ipaddress calls global
    "240.0.0.1",
    "255.255.255.255",
    "192.0.2.1",  # documentation
    "::1",
    "::",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    "fe80::1%eth0",
    "fec0::1",  # site-local, which ipaddress calls global
    "ff0e::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::127.0.0.1",  # IPv4-compatible, which ipaddress calls global
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1, which ipaddress calls global
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "64:ff9b:1::8.8.8.8",  # local-use NAT64
    "2001:db8::1",
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8", "2002:808:808::1"]


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_public_refuses_what_is_not_globally_routable(address: str) -> None:
    assert not AllowList("public").allows_address(address)
    assert not AllowList().allows_address(address)  # public is the default


@pytest.mark.parametrize("address", PUBLIC)
def test_public_allows_globally_routable_addresses(address: str) -> None:
    assert AllowList("public").allows_address(address)


def test_star_allows_anything() -> None:
    allow = AllowList("*")
    assert allow.allows_address("127.0.0.1") and allow.allows_address("::1")
    assert allow.allows_name("anything.example")
    allow.check_url("http://127.0.0.1/")
    allow.check_url("http://localhost:8080/")


def test_addresses_and_ranges() -> None:
    allow = AllowList("10.0.0.0/8, 192.168.1.7 ,fd00::/8,::1")
    assert allow.allows_address("10.200.3.4")
    assert allow.allows_address("192.168.1.7")
    assert not allow.allows_address("192.168.1.8")
    assert allow.allows_address("fd00::5")
    assert allow.allows_address("::1")
    assert not allow.allows_address("8.8.8.8")  # no public here
    # A mapped address reaches the IPv4 one: an entry for it matches both forms.
    assert allow.allows_address("::ffff:10.1.1.1")
    assert not allow.allows_address("not an address")


def test_bracketed_ipv6_entry() -> None:
    assert AllowList("[::1]").allows_address("::1")


def test_host_names_are_exact_and_case_insensitive() -> None:
    allow = AllowList("Hooks.Example.COM")
    assert allow.allows_name("hooks.example.com")
    assert allow.allows_name("HOOKS.example.com.")  # a trailing dot is the same name
    assert not allow.allows_name("example.com")
    assert not allow.allows_name("a.hooks.example.com")


def test_suffix_matches_subdomains_not_the_bare_suffix() -> None:
    allow = AllowList("*.example.com")
    assert allow.allows_name("a.example.com")
    assert allow.allows_name("a.b.example.com")
    assert not allow.allows_name("example.com")
    assert not allow.allows_name("badexample.com")


def test_a_name_entry_allows_every_address_of_that_name() -> None:
    allow = AllowList("internal.example")
    assert allow.allowed_addresses("internal.example", ["10.0.0.1", "::1"]) == ["10.0.0.1", "::1"]
    assert allow.allowed_addresses("other.example", ["10.0.0.1"]) == []


def test_allowed_addresses_filters_and_keeps_order() -> None:
    allow = AllowList("public,10.0.0.0/8")
    found = ["127.0.0.1", "8.8.8.8", "192.168.0.1", "10.9.9.9", "::1"]
    assert allow.allowed_addresses("some.example", found) == ["8.8.8.8", "10.9.9.9"]


def test_str_gives_the_list_back_as_configured() -> None:
    allow = AllowList(["public, 10.0.0.0/8", "*.Example.com"])
    assert str(allow) == allow.describe() == "public,10.0.0.0/8,*.Example.com"
    assert str(AllowList()) == "public"
    assert repr(AllowList.parse("::1")) == "AllowList('::1')"


@pytest.mark.parametrize(
    "entry",
    ["10.0.0.1/8", "10.0.0.0/33", "exa mple.com", "*.", "-bad.example", "bücher.de", "a..b"],
)
def test_a_bad_entry_raises_naming_it(entry: str) -> None:
    with pytest.raises(ValueError, match="entry") as caught:
        AllowList(f"public,{entry}")
    assert repr(entry) in str(caught.value)


def test_a_name_entry_must_resolve_at_start() -> None:
    """config.py calls this: a word that is no host stops the start, named as written."""
    AllowList("public,LocalHost.,*.nowhere.invalid,10.0.0.0/8,*").check_names_resolve()
    with pytest.raises(ValueError) as caught:
        AllowList("localhost,Hooks.Nowhere.INVALID").check_names_resolve()
    assert "entry 'Hooks.Nowhere.INVALID' is not public, *, an address" in str(caught.value)


def test_blank_parts_are_skipped_but_a_blank_list_is_refused() -> None:
    assert str(AllowList("public,,127.0.0.1,")) == "public,127.0.0.1"
    with pytest.raises(ValueError, match="empty"):
        AllowList(" , ")


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1/", "http://localhost/", "http://LocalHost.:80/x", "http://a.localhost/"],
)
def test_loopback_is_refused_at_add_by_default(url: str) -> None:
    with pytest.raises(ValueError, match=r"loopback.*--http-allow=public"):
        AllowList().check_url(url)


def test_check_url_names_the_host_and_the_list() -> None:
    with pytest.raises(ValueError) as caught:
        AllowList("public").check_url("http://10.1.2.3:8080/hook?token=x")
    assert str(caught.value) == "host 10.1.2.3 (private) is refused by --http-allow=public"
    with pytest.raises(ValueError, match=r"host \[?::1\]? \(loopback\)"):
        AllowList().check_url("http://[::1]:8080/")


@pytest.mark.parametrize(
    ("allow", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8080/"),
        ("127.0.0.1", "http://localhost:8080/"),
        ("127.0.0.0/8", "http://a.localhost/"),
        ("::1", "http://[::1]/"),
        ("::1", "http://localhost/"),  # localhost is 127.0.0.1 or ::1
        ("localhost", "http://localhost:8080/"),
        ("*", "http://127.0.0.1/"),
    ],
)
def test_loopback_is_allowed_when_the_operator_says_so(allow: str, url: str) -> None:
    AllowList(allow).check_url(url)


def test_a_name_entry_does_not_allow_an_address() -> None:
    with pytest.raises(ValueError, match="refused"):
        AllowList("localhost").check_url("http://127.0.0.1/")


def test_a_name_passes_add_when_an_address_rule_may_allow_it_after_dns() -> None:
    AllowList("public").check_url("https://hooks.example.com/x")
    AllowList("10.0.0.0/8").check_url("https://hooks.example.com/x")


def test_a_name_is_refused_at_add_when_only_name_entries_exist_and_none_match() -> None:
    allow = AllowList("hooks.example.com,*.internal")
    allow.check_url("https://hooks.example.com/")
    allow.check_url("https://a.internal/")
    with pytest.raises(ValueError, match=r"other\.example\.com matches no entry"):
        allow.check_url("https://other.example.com/")
    with pytest.raises(ValueError, match="internal"):
        allow.check_url("https://internal/")


@pytest.mark.parametrize("host", ["127.1", "2130706433", "10.0.0.010"])
def test_numeric_ipv4_forms_are_refused(host: str) -> None:
    # getaddrinfo reads these as addresses; "10.0.0.010" is not a valid dotted quad either.
    with pytest.raises(ValueError, match="numeric IPv4"):
        AllowList("*").check_url(f"http://{host}/")


def test_a_url_without_a_host_is_refused() -> None:
    with pytest.raises(ValueError, match="no host"):
        AllowList("*").check_url("http:///path")
