"""Clients of Iceberg catalogs that pyiceberg does not ship (loaded through its ``py-catalog-impl``)."""
