"""A replicated table service on named logs (seed 003, HerdDB's pattern): tablespaces of key-value
tables, one replica leading each, every change a record of the tablespace's log. docs/tablespace.md."""
