"""The broker's storage tier: the write-ahead log, the segment log store, the metadata
database, the object store and segment retention."""
