"""The peer protocol's bytes: frames, HELLO and message codecs."""
