from hypothesis import given, settings
from hypothesis import strategies as st

from metastore.wire.envelope import Envelope, EnvelopeError, decode_envelope, encode_envelope

text = st.text(max_size=20)
envelopes = st.builds(Envelope, st.integers(0, 4), st.integers(0, 255), st.integers(-2**63, 2**63 - 1),
                      st.lists(st.tuples(text, text), max_size=3).map(tuple), st.binary(max_size=50))


@given(envelopes)
def test_round_trip(e):
    assert decode_envelope(encode_envelope(e)) == e


@settings(max_examples=300)
@given(st.binary(max_size=80))
def test_random_bytes_give_a_clean_error_or_an_envelope(buf):
    try:
        decode_envelope(buf)
    except EnvelopeError:
        pass


@given(envelopes)
def test_truncations_are_refused_or_decode_to_a_shorter_payload(e):
    raw = encode_envelope(e)
    for cut in range(len(raw)):
        try:
            got = decode_envelope(raw[:cut])
        except EnvelopeError:
            continue
        assert got.auth == e.auth and e.payload.startswith(got.payload)
