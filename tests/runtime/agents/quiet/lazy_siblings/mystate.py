LOG = []
