"""A CA certificate for the unit tests of TLS settings: parsed and carried, never used to
verify a connection."""

# A throw-away CA's certificate (public; its key was discarded when it was made).
TEST_CA_PEM = """-----BEGIN CERTIFICATE-----
MIIBijCCATCgAwIBAgIUVukEoNhGBcD3ZKVqwNajUwMB/zcwCgYIKoZIzj0EAwIw
IjEgMB4GA1UEAwwXYmF0Y2hwaWxvdC11bml0LXRlc3QtY2EwIBcNMjYxMjAxMTY0
MDQ4WhgPMjEyNjExMDcxNjQwNDhaMCIxIDAeBgNVBAMMF2JhdGNocGlsb3QtdW5p
dC10ZXN0LWNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEHGRVzeMpalt4jaY2
qVTqKf/y5SxkAVtKrnLhjkCDyyEbJmKOVd66QhjKroDDXZu4NpKLIjaQQJxPfNzA
trX1RKNCMEAwDwYDVR0TAQH/BAUwAwEB/zAOBgNVHQ8BAf8EBAMCAQYwHQYDVR0O
BBYEFCImrch4EU6BeftICC91T35ISJgdMAoGCCqGSM49BAMCA0gAMEUCIFxuZp3F
lQR1KegP8M6GyqBcOOULfHIGcjUWwRFAVRbIAiEAxVC2UuB/ncUK6fQaWX4JWMeu
Z6jNxG1g9xtpi0q6Ilg=
-----END CERTIFICATE-----
"""
