package dev.flotilla.connect;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.Properties;

/** The version Connect lists for our plugins: the Maven project's, filtered into version.properties at build time. */
final class PluginVersion {

    static final String VALUE = load();

    private PluginVersion() {}

    private static String load() {
        try (InputStream in = PluginVersion.class.getResourceAsStream("version.properties")) {
            if (in == null) {
                throw new IllegalStateException("dev/flotilla/connect/version.properties is missing from the jar");
            }
            Properties props = new Properties();
            props.load(in);
            return props.getProperty("version");
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read dev/flotilla/connect/version.properties", e);
        }
    }
}
