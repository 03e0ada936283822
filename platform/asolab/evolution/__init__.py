"""Evolution: Gumbel-softmax sampling, temperature schedules, mutation and growth."""
