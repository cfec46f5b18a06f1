"""The scheduler: waiting/running queues, batch building with prefix reuse, stop checks."""
