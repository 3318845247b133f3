"""The wheel query: intake → parse → wheel (state/) → the ready topic; its checkpoint, delayOffset, heartbeat and partition sizing."""
