"""The coordinator: parses plans and schedules their tasks onto shard lanes."""
