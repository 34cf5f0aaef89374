# The twin example and the baton command in one image (ghcr.io/batonhq/baton-twin:0.1.0):
# 'twin -serve :8080' is a member of the twins group (deploy/README.md lists its environment),
# 'twin -migrate' creates its tables as the migration role; 'baton' is the operator's command
# (status, who-owns, eras, recover).
# Build from the repository root: docker build -f deploy/compose/twin.Dockerfile .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Pure Go (the SQLite driver is modernc.org/sqlite): a static binary for a distroless image.
RUN CGO_ENABLED=0 go build -trimpath -ldflags=-s -o /out/twin ./examples/twin && \
    CGO_ENABLED=0 go build -trimpath -ldflags=-s -o /out/baton ./cmd/baton

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/twin /out/baton /usr/local/bin/
USER 65532:65532
EXPOSE 8080
CMD ["twin", "-serve", ":8080"]
