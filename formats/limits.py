"""Ranges every command and file shares."""

# Timed or warm-up runs per launch (replay --repeat/--warmup, bisect, advise, campaign repeats):
# past this a profile takes days, not a night (at a few us a run, times the launches).
MAX_RUNS = 100_000
