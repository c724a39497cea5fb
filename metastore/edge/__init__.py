"""The client port (trio edge): connections, the guard on client input, SASL, four-letter words."""
