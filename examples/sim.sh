#!/bin/sh
# One simulation of an array: its index (XCE_ARRAY_INDEX) is its seed.
# Submit 20 of them, at most 5 at once:  xce submit -J "sims[1-20]%5" -- ./sim.sh
seed="${XCE_ARRAY_INDEX:-1}"
sleep 1
echo "simulation ${seed} of array ${XCE_ARRAY_ID:-none}: result $(( seed * seed % 97 ))"
