"""%%amp_compare: variants, rounds, compile cost, numerics, rendering."""
