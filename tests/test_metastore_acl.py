"""ACLs: ZooKeeper's digest computation, ip matching, the ACL fix-up of create and
setACL requests, and permission checks (ZooKeeperServer.checkACL)."""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from metastore.core.acl import (ACL, ANYONE_ID, CREATOR_ALL_ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, SUPER_ID, Id, Perm,
                           check, digest_auth_id, digest_auth_ids, encode_acl, fixup_acl, generate_digest, ip_matches,
                           is_valid_id, obfuscated, parse_super_digest, require, validate_acl)
from metastore.errors import InvalidACL, NoAuth

ALICE = digest_auth_id(b"alice:secret")
CLIENT_IP = Id("ip", "10.1.2.3")
SUPER_DIGEST = "super:D/InIHSb7yEEbrWz8b9l71RjZJU="  # generate_digest("super:test")


def test_digest_is_computed_as_zookeeper_does():
    # The superDigest ZooKeeper's own test suite configures, for "super:test".
    assert generate_digest("super:test") == "super:D/InIHSb7yEEbrWz8b9l71RjZJU="
    assert ALICE == Id("digest", "alice:" + generate_digest("alice:secret").split(":", 1)[1])
    assert generate_digest("nocolon").startswith("nocolon:")  # user part: all before the first ':'
    assert generate_digest("a:b:c").startswith("a:")


def test_perm_bits():
    assert (Perm.READ, Perm.WRITE, Perm.CREATE, Perm.DELETE, Perm.ADMIN, Perm.ALL) == (1, 2, 4, 8, 16, 31)


@pytest.mark.parametrize("client, expr, expected", [
    ("10.1.2.3", "10.1.2.3", True),
    ("10.1.2.3", "10.0.0.0/8", True),
    ("11.1.2.3", "10.0.0.0/8", False),
    ("10.1.2.3", "10.1.2.0/24", True),
    ("10.1.3.3", "10.1.2.0/23", True),
    ("10.1.4.3", "10.1.2.0/23", False),
    ("1.2.3.4", "0.0.0.0/0", True),
    ("10.1.2.3", "10.1.2.3/33", False),     # prefix longer than the address
    ("10.1.2.3", "10.1.2.3/x", False),
    ("10.1.2.3", "10.1.2", False),
    ("10.1.2.3", "10.1.2.256", False),
    ("::1", "::1", True),
    ("0:0:0:0:0:0:0:1", "::1/128", True),
    ("fe80::1", "fe80::/10", True),
    ("fec0::1", "fe80::/10", False),
    ("2001:db8::7", "2001:db8::/32", True),
    ("10.1.2.3", "::/0", False),            # IPv4 client, IPv6 ACL
    ("1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8", True),
    ("1:2:3:4:5:6:7", "1:2:3:4:5:6:7", False),
    ("1::2::3", "::/0", False),
    ("12345::", "::/0", False),
    ("localhost", "localhost", False),
])
def test_ip_matching(client, expr, expected):
    assert ip_matches(client, expr) is expected


def test_valid_ids():
    assert is_valid_id(ANYONE_ID) and not is_valid_id(Id("world", "someone"))
    assert is_valid_id(Id("digest", "u:hash")) and not is_valid_id(Id("digest", "nohash"))
    assert not is_valid_id(Id("digest", "u:")) and not is_valid_id(Id("digest", "a:b:c"))
    assert is_valid_id(Id("ip", "10.0.0.0/8")) and not is_valid_id(Id("ip", "10.0.0.0/40"))
    assert not is_valid_id(Id("nosuchscheme", "x")) and not is_valid_id(Id("auth", ""))


def test_fixup_expands_auth_to_the_sessions_authenticated_ids():
    bob = digest_auth_id(b"bob:pw")
    acl = fixup_acl("/p", CREATOR_ALL_ACL, [CLIENT_IP, ALICE, bob])
    assert acl == (ACL(Perm.ALL, ALICE), ACL(Perm.ALL, bob))  # ip ids are not "authenticated"
    with pytest.raises(InvalidACL):
        fixup_acl("/p", CREATOR_ALL_ACL, [CLIENT_IP])


def test_fixup_drops_duplicates_and_refuses_bad_lists():
    assert fixup_acl("/p", OPEN_ACL_UNSAFE * 2, []) == OPEN_ACL_UNSAFE
    for bad in ([], [ACL(Perm.ALL, Id("world", "someone"))], [ACL(Perm.READ, Id("sasl", "a@b@c"))]):
        with pytest.raises(InvalidACL) as info:
            fixup_acl("/p", bad, [ALICE])
        assert info.value.code == -114
    with pytest.raises(InvalidACL):
        validate_acl("/p", [])
    validate_acl("/p", READ_ACL_UNSAFE)


def test_check_follows_zookeepers_rules():
    mixed = (ACL(Perm.READ, ANYONE_ID), ACL(Perm.WRITE | Perm.DELETE, ALICE), ACL(Perm.ADMIN, Id("ip", "10.0.0.0/8")))
    assert check(mixed, Perm.READ, [])
    assert not check(mixed, Perm.WRITE, [])
    assert check(mixed, Perm.WRITE, [ALICE]) and check(mixed, Perm.DELETE, [ALICE])
    assert not check(mixed, Perm.CREATE, [ALICE, CLIENT_IP])
    assert check(mixed, Perm.ADMIN, [CLIENT_IP]) and not check(mixed, Perm.ADMIN, [Id("ip", "11.0.0.1")])
    assert not check(mixed, Perm.WRITE, [Id("ip", ALICE.id)])  # schemes must match
    assert check((), Perm.ADMIN, [])  # an empty ACL allows everything
    assert check(((ACL(Perm.READ, ALICE)),), Perm.ADMIN, [Id("super", "")])
    with pytest.raises(NoAuth) as info:
        require(READ_ACL_UNSAFE, Perm.WRITE, [], "/x")
    assert info.value.code == -102 and info.value.path == "/x"


def test_acl_encoding_is_canonical():
    assert encode_acl(OPEN_ACL_UNSAFE) == (
        b"\x00\x00\x00\x01" + b"\x00\x00\x00\x1f" + b"\x00\x00\x00\x05world" + b"\x00\x00\x00\x06anyone")


def test_get_acl_without_admin_shows_digest_ids_without_their_hash():
    assert obfuscated((ACL(1, Id("digest", "u:abc:def")),)) == (ACL(1, Id("digest", "u:x")),)
    assert obfuscated((ACL(1, Id("digest", "u:a\nb:c")),)) == (ACL(1, Id("digest", "u:x\nb:x")),)  # as Java's
    assert obfuscated(OPEN_ACL_UNSAFE) == OPEN_ACL_UNSAFE
    assert obfuscated((ACL(31, CLIENT_IP),)) == (ACL(31, CLIENT_IP),)


def test_the_super_digest_gives_the_super_id_beside_the_digest_id():
    assert digest_auth_ids(b"super:test", SUPER_DIGEST) == [SUPER_ID, digest_auth_id(b"super:test")]
    assert digest_auth_ids(b"super:wrong", SUPER_DIGEST) == [digest_auth_id(b"super:wrong")]
    assert digest_auth_ids(b"super:test", None) == [digest_auth_id(b"super:test")]
    assert check(((ACL(Perm.READ, ALICE)),), Perm.ALL, [SUPER_ID])
    # Holding the super digest as a digest id is not being super.
    assert not check(((ACL(Perm.READ, ALICE)),), Perm.READ, [Id("digest", SUPER_DIGEST)])
    with pytest.raises(InvalidACL):
        fixup_acl("/p", [ACL(Perm.ALL, SUPER_ID)], [])  # no provider names "super" in a stored ACL


@pytest.mark.parametrize("text", ["", "super", "super:", ":abc", "super:not base64!", "super:YWJj",
                                  SUPER_DIGEST + ":more"])
def test_a_malformed_super_digest_is_refused_with_what_to_do(text):
    with pytest.raises(ValueError, match="generate_digest"):
        parse_super_digest(text)


def test_parse_super_digest_takes_zookeepers_format():
    assert parse_super_digest(SUPER_DIGEST) == SUPER_DIGEST
    assert parse_super_digest("admin:" + SUPER_DIGEST.split(":")[1]).startswith("admin:")


@pytest.mark.parametrize("dn, valid", [
    ("CN=alice,OU=apps,O=Quire", True),
    ("CN=a\\,b+UID=7", True),                      # an escaped comma; a multi-valued RDN
    ("1.2.840.113549.1.9.1=#160b61406578616d706c652e6f7267", True),  # an OID type, a BER value
    ('CN="x,y", O = b ; C=US', True),               # quoted; X500Principal's spaces and ";"
    ("", True),                                     # the empty DN, as X500Principal("")
    ("alice", False), ("CN", False), ("=alice", False), ("CN=alice,", False), ('CN="open', False),
    ("CN=#abc", False), ("CN=a\\", False),
])
def test_x509_ids_are_distinguished_names(dn, valid):
    assert is_valid_id(Id("x509", dn)) is valid


def test_x509_validation_is_linear_in_hostile_ids():
    # Ids come from clients' setACL: a backtracking pattern would stall the leader for minutes.
    for hostile in ("CN=a" + " " * 200_000 + '"', "CN=a" + " b" * 100_000 + '"', ",CN=a" * 100_000,
                    'CN="' + '\\"' * 100_000, "CN=a," * 100_000 + '"'):
        assert not is_valid_id(Id("x509", hostile))


def test_x509_ids_match_exactly_and_auth_expands_to_them():
    dn = Id("x509", "CN=alice,OU=apps,O=Quire")
    acl = fixup_acl("/p", [ACL(Perm.ALL, dn)], [])
    assert acl == (ACL(Perm.ALL, dn),)
    assert check(acl, Perm.WRITE, [CLIENT_IP, Id("x509", "CN=alice,OU=apps,O=Quire")])
    assert not check(acl, Perm.WRITE, [Id("x509", "CN=alice")])
    assert not check(acl, Perm.WRITE, [Id("digest", dn.id)])
    assert fixup_acl("/p", CREATOR_ALL_ACL, [CLIENT_IP, dn]) == (ACL(Perm.ALL, dn),)  # x509 is authenticated


_OIDS = [NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME, NameOID.COUNTRY_NAME,
         NameOID.EMAIL_ADDRESS, NameOID.SERIAL_NUMBER, NameOID.DOMAIN_COMPONENT, NameOID.USER_ID]
_values = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_rdns = st.lists(st.lists(st.tuples(st.sampled_from(_OIDS), _values), min_size=1, max_size=2), max_size=4)


@settings(derandomize=True, database=None, max_examples=300, deadline=None)
@given(_rdns)
def test_every_subject_a_certificate_can_name_is_a_valid_x509_id(rdns):
    """The TLS edge gives a client Name.rfc4514_string() (clusterd/tls_context.py): each must be
    storable in an ACL, or its owner could never be granted anything."""
    try:
        name = x509.Name([x509.RelativeDistinguishedName([x509.NameAttribute(o, v) for o, v in rdn]) for rdn in rdns])
    except ValueError:
        return  # e.g. a country name that is not two letters, or an attribute twice in an RDN
    assert is_valid_id(Id("x509", name.rfc4514_string()))
