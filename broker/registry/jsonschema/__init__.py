"""JSON Schema in the registry: the document model and compatibility."""
