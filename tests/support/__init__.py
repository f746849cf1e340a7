"""Helpers shared across test tiers: plain modules that pytest never collects."""
