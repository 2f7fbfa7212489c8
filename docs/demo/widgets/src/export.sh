#!/bin/sh
# Print the widgets, one per line.
for w in sprocket gear flange; do
  echo "$w"
done
