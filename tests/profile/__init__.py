"""%%torchprofile: the magic, trace analysis, diagnosis rules, rendering."""
