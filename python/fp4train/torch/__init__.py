"""PyTorch side of fp4train. :mod:`fp4train.torch.models` is a plain-PyTorch implementation of
fp4train's models (pure Python, no compiled extension), for checking fp4train against an
independent framework and for loading ``fp4train export`` directories."""
