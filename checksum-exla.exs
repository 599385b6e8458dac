# SHA-256 of the precompiled NIF archives of this version, and of the
# native sources they were built from. Written by `mix exla.checksum`;
# `mix compile` refuses an archive whose digest differs. Empty in the
# repository (every build is from source): the release workflow fills it
# in before publishing.
%{}
