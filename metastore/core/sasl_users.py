"""The SASL users file: ZooKeeper's JAAS `Server` section with DigestLoginModule (pure).

The file ZooKeeper reads through `-Djava.security.auth.login.config` works here unchanged:

    Server {
        org.apache.zookeeper.server.auth.DigestLoginModule required
        user_super="adminsecret"
        user_alice="secret";
    };

Each `user_<name>="<password>"` option of the DigestLoginModule entry of the `Server`
section is a user (ZooKeeper's SaslServerCallbackHandler). Other sections (a `Client`
section for zkCli.sh, `QuorumServer`...) and other options are ignored. The syntax is
Java's JAAS configuration file: `Name { ModuleClass Flag key=value ... ; ... };` with
`//`, `/* */` and `#` comments and values in double or single quotes. `${property}`
expansion is not done: a value containing it is refused, so a password never silently
becomes the literal text. Parse errors name the line and what to write instead.
"""

from __future__ import annotations

import re

SERVER_SECTION = "Server"  # ZooKeeper's zookeeper.sasl.serverconfig default
DIGEST_MODULE = "org.apache.zookeeper.server.auth.DigestLoginModule"
FLAGS = frozenset({"required", "requisite", "sufficient", "optional"})
USER_PREFIX = "user_"

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>//[^\n]*|\#[^\n]*|/\*(?:[^*]|\*(?!/))*\*/)
  | (?P<quoted>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<word>[A-Za-z0-9_.$*\-]+)
  | (?P<punct>[{};=])
""", re.X | re.S)
_ESCAPES = re.compile(r"\\(.)", re.S)
_JAVA_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


class JaasError(ValueError):
    """The users file cannot be used; the message names the line and the fix."""


def parse_jaas_users(text: str, section: str = SERVER_SECTION) -> dict[str, str]:
    """username -> password from the DigestLoginModule entry of `section`."""
    sections = _parse(_tokens(text))
    if section not in sections:
        found = ", ".join(sorted(sections)) or "none"
        raise JaasError(f"no {section} section (sections found: {found}); add "
                        f'{section} {{ {DIGEST_MODULE} required user_alice="password"; }};')
    users: dict[str, str] = {}
    for module, options, line in sections[section]:
        if module.rsplit(".", 1)[-1] != DIGEST_MODULE.rsplit(".", 1)[-1]:
            raise JaasError(f"line {line}: login module {module} in the {section} section: only "
                            f"{DIGEST_MODULE} (SASL DIGEST-MD5) is served")
        for key, value in options.items():
            if key.startswith(USER_PREFIX):
                name = key[len(USER_PREFIX):]
                if not name:
                    raise JaasError(f"line {line}: option {key!r} names no user (write user_<name>=...)")
                if "${" in value:
                    raise JaasError(f"line {line}: the password of {name!r} uses ${{...}} expansion, "
                                    "which is not done here: write the password itself")
                users[name] = value
    if not users:
        raise JaasError(f"the {section} section has no user_<name>=\"<password>\" option: no one could log in")
    return users


def _tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, line) of each token; comments and spaces dropped."""
    out: list[tuple[str, str, int]] = []
    pos, line = 0, 1
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            snippet = text[pos:pos + 20].split("\n", 1)[0]
            raise JaasError(f"line {line}: cannot read {snippet!r} (an unclosed quote or comment, "
                            "or a character JAAS does not allow here)")
        kind = match.lastgroup
        assert kind is not None
        if kind == "quoted":
            out.append(("value", _unquote(match.group()[1:-1]), line))
        elif kind in ("word", "punct"):
            out.append((kind, match.group(), line))
        line += match.group().count("\n")
        pos = match.end()
    return out


def _unquote(body: str) -> str:
    return _ESCAPES.sub(lambda m: _JAVA_ESCAPES.get(m.group(1), m.group(1)), body)


class _Reader:
    def __init__(self, tokens: list[tuple[str, str, int]]) -> None:
        self.tokens, self.pos = tokens, 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def line(self) -> int:
        tok = self.peek() or (self.tokens[-1] if self.tokens else None)
        return tok[2] if tok else 1

    def take(self, kind: str, what: str, text: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (tok[0] != kind and not (kind == "value" and tok[0] == "word")) \
                or (text is not None and tok[1] != text):
            got = "the end of the file" if tok is None else repr(tok[1])
            raise JaasError(f"line {self.line()}: expected {what}, got {got}")
        self.pos += 1
        return tok[1]


Sections = dict[str, list[tuple[str, dict[str, str], int]]]


def _parse(tokens: list[tuple[str, str, int]]) -> Sections:
    """Name { Module Flag (key=value)* ; ... } ; ..."""
    reader = _Reader(tokens)
    sections: Sections = {}
    while reader.peek() is not None:
        name = reader.take("word", "a section name such as Server")
        if name in sections:
            raise JaasError(f"line {reader.line()}: section {name} appears twice")
        reader.take("punct", "'{'", "{")
        entries = sections[name] = []
        while (tok := reader.peek()) is not None and tok[1] != "}":
            entries.append(_entry(reader))
        reader.take("punct", "'}'", "}")
        reader.take("punct", "';' after '}'", ";")
    return sections


def _entry(reader: _Reader) -> tuple[str, dict[str, str], int]:
    line = reader.line()
    module = reader.take("word", "a login module class")
    flag = reader.take("word", "a flag (required, requisite, sufficient, optional)")
    if flag.lower() not in FLAGS:
        raise JaasError(f"line {line}: flag {flag!r} is not one of {', '.join(sorted(FLAGS))}")
    options: dict[str, str] = {}
    while (tok := reader.peek()) is not None and tok[1] != ";":
        key = reader.take("word", "an option name or ';'")
        reader.take("punct", f"'=' after {key}", "=")
        if key in options:
            raise JaasError(f"line {reader.line()}: option {key} appears twice")
        options[key] = reader.take("value", f"a value for {key}")
    reader.take("punct", "';' after the options", ";")
    return module, options, line
