"""Evolution: temperature schedules, mutation and growth."""
