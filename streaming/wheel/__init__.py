"""The wheel query: intake → parse → wheel (state/) → the ready topic, and its checkpoint."""
