"""The ``verl.plugins`` entry point: verl imports this module (and calls nothing); importing it boots the plugin."""

from verl_ascend_ext.runtime.boot import activate_or_exit

activate_or_exit("verl")
