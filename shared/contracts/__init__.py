"""Message contracts: one module per subject family, msgspec structs, JSON on the wire."""
