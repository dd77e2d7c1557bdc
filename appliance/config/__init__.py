"""What to serve and how: the settings, and the appliance's own config file read into them."""
